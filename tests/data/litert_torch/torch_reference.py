"""The PyTorch originals of the litert-torch vision fixtures in this folder.

Each fixture ``<name>_f32.tflite`` (and ``<name>_q8.tflite`` where present)
was converted by ``generate.py`` from ``module(0, name)``; this file rebuilds
the same torchvision architecture with the same seeded weights, so that a
test can compare the original with the fixture's recorded outputs and
``benchmarks/device.py`` can time it side by side with fbjax.

``module(seed, name=DEFAULT) -> torch.nn.Module`` (eval mode, float32) and
``inputs(batch, name=DEFAULT) -> (x,)`` with ``x`` float32 ``[batch, 3, S, S]``
(NCHW, standard normal, seeded by the batch size) are what device.py calls;
``NAMES`` lists every architecture.

Weights: torchvision's constructor under ``torch.manual_seed(seed)``, then
every floating parameter and buffer redrawn from a ``torch.Generator``
seeded with ``seed`` in ``state_dict`` order (torchvision zero-initialises
the ViT head and leaves batch-norm statistics at 0/1, which would hide
errors): matrices and kernels N(0, 1/fan_in), norm scales 1 + N(0, 0.1^2),
biases, shifts and ViT's class token and position embedding N(0, 0.1^2), running variances U[0.5, 1.5).
Needs torch and torchvision (``pip install torch==2.14.1 torchvision==0.29.1``).
"""

from __future__ import annotations

import math

import torch
import torchvision
from torchvision.models import mobilenetv3

#: name -> input side S (square RGB images)
#: (torchvision's ResNet(BasicBlock, [1, 1, 1, 1]) is not here: 4.9 M parameters, 19.7 MB in float32,
#: over the 2 MB a committed fixture may take; BasicBlock has no width option.)
SIZES = {"mobilenet_v3_small": 64, "vit": 32}  # the first is what a smoke run times
NAMES = tuple(SIZES)
DEFAULT = "mobilenet_v3_small"


def _build(name: str) -> torch.nn.Module:
    if name == "vit":
        return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                    hidden_dim=64, mlp_dim=128, num_classes=10)
    if name == "mobilenet_v3_small":
        settings, last_channel = mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25)
        return mobilenetv3.MobileNetV3(settings, last_channel, num_classes=10)
    raise KeyError(f"unknown fixture architecture {name!r}; known: {', '.join(NAMES)}")


def module(seed: int = 0, name: str = DEFAULT) -> torch.nn.Module:
    """The architecture ``name`` with the seeded random weights of its fixture, eval mode, float32."""
    torch.manual_seed(seed)
    net = _build(name).eval()
    gen = torch.Generator().manual_seed(seed)
    sd = net.state_dict()
    with torch.no_grad():
        for key, t in sd.items():
            if not t.is_floating_point():
                continue
            if key.endswith("running_var"):
                new = 0.5 + torch.rand(t.shape, generator=gen)
            elif key.endswith(("class_token", "pos_embedding")):  # ViT's [1, n, D] embeddings
                new = 0.1 * torch.randn(t.shape, generator=gen)
            elif t.dim() >= 2:  # Linear [out, in], Conv2d [out, in / groups, kh, kw]
                new = torch.randn(t.shape, generator=gen) / math.sqrt(math.prod(t.shape[1:]))
            elif key.endswith("weight"):  # 1-D weights are norm scales
                new = 1.0 + 0.1 * torch.randn(t.shape, generator=gen)
            else:
                new = 0.1 * torch.randn(t.shape, generator=gen)
            t.copy_(new)
    return net


def inputs(batch: int, name: str = DEFAULT) -> tuple:
    """``(x,)``: float32 ``[batch, 3, S, S]`` standard normal, seeded by ``batch``."""
    s = SIZES[name]
    return (torch.randn((batch, 3, s, s), generator=torch.Generator().manual_seed(batch)),)
