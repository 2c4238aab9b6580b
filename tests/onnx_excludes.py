"""ONNX node-suite cases (converted by rten-convert 0.22) that fbjax is known to fail.

The suite runs in two modes (see ``test_onnx_conformance.py``):

* ``"as converted"``: the ``.onnx`` converted as it is;
* ``"explicit defaults"``: :func:`rten_convert_tools.make_defaults_explicit`
  first states ONNX defaults rten-convert would replace (Softmax-family
  ``axis``), then converts.

Maps the case name to the reason; each reason starts with the modes it
applies to, ``[as converted]`` or ``[both modes]`` (:func:`excluded` reads
the tag). Reasons whose text starts with ``converter:`` are cases where the
``.rten`` file rten-convert writes does not carry the ONNX model's meaning
(an attribute dropped or mapped to something else); fbjax runs the file as
written, as RTen would. ``random:`` cases draw from JAX's PRNG, so their
exact expected values cannot match (their distributions are tested in
``test_onnx_conformance.py``). The others are fbjax or runtime-type
limitations. Each mode's pass rate counts all of them as failures; they are
listed so that every other failure is a regression.
"""

from __future__ import annotations

from typing import Optional

AS_CONVERTED = "as converted"
EXPLICIT = "explicit defaults"
MODES = (AS_CONVERTED, EXPLICIT)
_TAGS = {"[as converted] ": (AS_CONVERTED,), "[both modes] ": MODES}


def modes(reason: str) -> tuple:
    """The modes an exclude reason applies to (from its tag)."""
    for tag, ms in _TAGS.items():
        if reason.startswith(tag):
            return ms
    raise ValueError(f"exclude reason without a mode tag: {reason[:60]!r}")


def excluded(name: str, mode: str) -> Optional[str]:
    """The reason ``name`` is excluded in ``mode``, or None."""
    r = EXCLUDES.get(name)
    return r if r is not None and mode in modes(r) else None


_SOFTMAX = ("[as converted] converter: rten-convert 0.22 writes a Softmax/LogSoftmax without an ONNX axis "
            "attribute as the RTen schema default axis 0 (ONNX's default is -1 from opset 13, 1 with 2-D coercion before); "
            "fbjax follows the file. Passes with explicit ONNX defaults (the pre-pass states the axis)")
_DROPOUT = ("[both modes] random: training-mode Dropout masks come from the model's JAX PRNG key (Model.state), "
            "not the numpy stream behind the expected values; test_training_dropout_cases_structure checks these "
            "cases' outputs (0 or x / (1 - ratio), mask, kept fraction within 5 standard errors)")
_CUBIC = ("[both modes] converter: rten-convert 0.22 maps Resize mode 'cubic' to Linear (it warns); "
          "the schema has no cubic mode")

EXCLUDES: dict[str, str] = {
    "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded": _SOFTMAX,
    "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded": _SOFTMAX,
    "test_attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded": _SOFTMAX,
    "test_attention_24_qk_matmul_output_mode3_softmax_precision_expanded": _SOFTMAX,
    "test_attention_3d_attn_mask_expanded": _SOFTMAX,
    "test_attention_3d_diff_heads_sizes_attn_mask_expanded": _SOFTMAX,
    "test_attention_3d_diff_heads_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_3d_gqa_attn_mask_expanded": _SOFTMAX,
    "test_attention_3d_gqa_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_3d_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_3d_with_past_and_present_qk_matmul_bias_expanded": _SOFTMAX,
    "test_attention_3d_with_past_and_present_qk_matmul_expanded": _SOFTMAX,
    "test_attention_3d_with_past_and_present_qk_matmul_softcap_expanded": _SOFTMAX,
    "test_attention_3d_with_past_and_present_qk_matmul_softmax_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_3d_causal_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_3d_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_4d_causal_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_4d_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_bool_4d_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_bool_expanded": _SOFTMAX,
    "test_attention_4d_attn_mask_expanded": _SOFTMAX,
    "test_attention_4d_causal_nonpad_attn_mask_composition_expanded": _SOFTMAX,
    "test_attention_4d_diff_heads_mask4d_padded_kv_expanded": _SOFTMAX,
    "test_attention_4d_diff_heads_sizes_attn_mask_expanded": _SOFTMAX,
    "test_attention_4d_diff_heads_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_4d_diff_heads_with_past_and_present_mask3d_expanded": _SOFTMAX,
    "test_attention_4d_diff_heads_with_past_and_present_mask4d_expanded": _SOFTMAX,
    "test_attention_4d_gqa_attn_mask_expanded": _SOFTMAX,
    "test_attention_4d_gqa_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_4d_gqa_with_past_and_present_fp16_expanded": ("[both modes] converter: Softmax axis as the other attention cases (as converted); with explicit "
        "defaults the expected values are float16 results while RTen runs float32 (max diff 5e-4, atol 1e-7)"),
    "test_attention_4d_softcap_neginf_mask_expanded": _SOFTMAX,
    "test_attention_4d_softcap_neginf_mask_poison_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_expanded": _SOFTMAX,
    "test_attention_4d_with_past_and_present_qk_matmul_expanded": _SOFTMAX,
    "test_attention_4d_with_qk_matmul_bias_expanded": _SOFTMAX,
    "test_attention_4d_with_qk_matmul_softcap_expanded": _SOFTMAX,
    "test_attention_4d_with_qk_matmul_softmax_expanded": _SOFTMAX,
    "test_attention_causal_boolmask_nan_robustness_expanded": _SOFTMAX,
    "test_attention_local_window_ext_cache_float16_mask_expanded": _SOFTMAX,
    "test_attention_local_window_ext_cache_rank2_mask_expanded": _SOFTMAX,
    "test_attention_local_window_ext_cache_rank3_head_mask_expanded": _SOFTMAX,
    "test_attention_local_window_ext_cache_rank4_batch_mask_expanded": _SOFTMAX,
    "test_attention_local_window_rank1_boolean_mask_expanded": _SOFTMAX,
    "test_logsoftmax_default_axis": _SOFTMAX,
    "test_logsoftmax_example_1": _SOFTMAX,
    "test_logsoftmax_large_number": _SOFTMAX,
    "test_softmax_default_axis": _SOFTMAX,
    "test_softmax_example": _SOFTMAX,
    "test_softmax_large_number": _SOFTMAX,
    "test_averagepool_2d_dilations": "[both modes] converter: rten-convert 0.22 drops AveragePool's dilations attribute (it warns); the schema's AveragePoolAttrs has no dilations",
    "test_averagepool_2d_same_lower": "[both modes] converter: ONNX SAME_LOWER is written as AutoPad.Same, which RTen computes as SAME_UPPER",
    "test_maxpool_2d_same_lower": "[both modes] converter: ONNX SAME_LOWER is written as AutoPad.Same, which RTen computes as SAME_UPPER",
    "test_convtranspose_output_shape": "[both modes] converter: rten-convert 0.22 drops ConvTranspose's output_shape attribute; the schema has no field for it",
    "test_dequantizelinear_blocked": "[both modes] converter: rten-convert 0.22 drops DequantizeLinear's block_size; the schema has no blocked quantization",
    "test_quantizelinear_blocked_asymmetric": "[both modes] converter: rten-convert 0.22 drops QuantizeLinear's block_size; the schema has no blocked quantization",
    "test_gru_batchwise": "[both modes] converter: rten-convert 0.22 drops GRU's layout=1 (batch-major) attribute without error; the schema has no layout field",
    "test_resize_downsample_scales_cubic": _CUBIC,
    "test_resize_downsample_scales_cubic_align_corners": _CUBIC,
    "test_resize_downsample_sizes_cubic": _CUBIC,
    "test_resize_upsample_scales_cubic": _CUBIC,
    "test_resize_upsample_scales_cubic_align_corners": _CUBIC,
    "test_resize_upsample_scales_cubic_asymmetric": _CUBIC,
    "test_resize_upsample_sizes_cubic": _CUBIC,
    "test_reduce_max_empty_set_bool": ("[both modes] runtime types: rten-convert writes the bool input as Int32 (RTen has no bool), "
                                      "so the file asks for an int32 ReduceMax over an empty set, whose ONNX result is "
                                      "INT32_MIN; the expected False (0) is bool's identity, which the .rten cannot show"),
    "test_bernoulli_seed_expanded": ("[both modes] random: RandomUniformLike draws from the model's JAX PRNG key (Model.state, "
                                    "initial key from the seed), not the numpy stream behind the expected values; the "
                                    "expanded Bernoulli's distribution is tested in test_random_ops_distributions"),
    "test_training_dropout": _DROPOUT,
    "test_training_dropout_default": _DROPOUT,
    "test_training_dropout_default_mask": _DROPOUT,
    "test_training_dropout_mask": _DROPOUT,
}
