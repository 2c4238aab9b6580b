"""Serving an LLM bundle with Ray Serve: replicas of fbjax's OpenAI-compatible server behind Ray's router.

Each replica of the deployment :class:`FbjaxLLM` loads the bundle, starts its own continuous-batching
engine (:class:`fbjax.serving.Engine`, ``slots`` rows of the KV cache) and serves the same Starlette app as
``fbjax serve`` (:func:`fbjax.serving.server.create_app`) through ``serve.ingress``: the same endpoints
(``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, streaming, the same error bodies). Ray's
HTTP proxy spreads requests over the replicas; within a replica, concurrent requests share decode steps.
``max_ongoing_requests`` lets a replica take more requests than it has slots: the rest wait in its engine.

    pip install 'ray[serve]' '.[serve]'
    python examples/ray_serve.py tests/data/llm_bundles/llama_hf_chat.litertlm --replicas 2      # serves until Ctrl-C
    curl http://127.0.0.1:8000/v1/completions -H "Content-Type: application/json" \\
         -d '{"model": "llama_hf_chat", "prompt": "Hello there", "max_tokens": 8}'
    python examples/ray_serve.py tests/data/llm_bundles/llama_hf_chat.litertlm --check   # one request, then exit

On a cluster: ``--address auto`` joins the running Ray cluster; ``--num-gpus 1`` gives each replica one GPU
(Ray sets ``CUDA_VISIBLE_DEVICES`` per replica, so JAX there sees that GPU alone). The bundle must be readable
at the same path on every node (a shared file system, or ship it with the job's ``runtime_env``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:  # a fresh clone without `pip install .`: use the repository's fbjax
    import fbjax  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray import serve


@serve.ingress()  # the ASGI app comes from __serve_build_asgi_app__, on each replica
class FbjaxLLM:
    """A Ray Serve replica: one bundle, one engine, fbjax's OpenAI-compatible Starlette app."""

    def __init__(self, bundle_path: str, slots: int = 8, model_id=None):
        import fbjax
        from fbjax.serving import Engine

        self.engine = Engine(fbjax.load(bundle_path), slots=slots).start()  # compiles before taking requests
        self.model_id = model_id

    def __serve_build_asgi_app__(self):
        from fbjax.serving.server import create_app

        return create_app(self.engine, self.model_id)

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def build(bundle_path: str, replicas: int = 1, slots: int = 8, num_cpus: float = 1, num_gpus: float = 0,
          model_id=None):
    """The bound Ray Serve application: ``replicas`` copies of :class:`FbjaxLLM` (each ``num_cpus`` CPUs,
    ``num_gpus`` GPUs), each taking up to ``4 * slots`` requests at a time (the rest queue in Ray)."""
    dep = serve.deployment(FbjaxLLM, name="fbjax", num_replicas=replicas, max_ongoing_requests=4 * slots,
                           ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus})
    return dep.bind(os.path.abspath(bundle_path), slots, model_id)


def run(app, host: str = "127.0.0.1", port: int = 8000):
    """Deploy ``app`` (Ray must be initialized) with Ray's HTTP proxy on ``host:port``; returns the base URL
    clients use (``http://host:port/v1``) once every replica is up."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name="fbjax", route_prefix="/", blocking=False)
    return f"http://{host}:{port}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve an LLM bundle with Ray Serve (see the module docstring)")
    ap.add_argument("bundle", help="a .litertlm or MediaPipe LLM .task bundle")
    ap.add_argument("--replicas", type=int, default=1, help="copies of the server behind Ray's router (default 1)")
    ap.add_argument("--slots", type=int, default=8, help="requests decoded together per replica (default 8)")
    ap.add_argument("--host", default="127.0.0.1", help="where Ray's HTTP proxy listens (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="the proxy's port (default 8000)")
    ap.add_argument("--address", default=None, help="a running Ray cluster ('auto'); default: a local one")
    ap.add_argument("--num-cpus", type=float, default=1, help="CPUs per replica")
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per replica")
    ap.add_argument("--check", action="store_true", help="send one chat request through Ray's router, then exit")
    a = ap.parse_args()
    import ray

    ray.init(address=a.address, include_dashboard=False)
    url = run(build(a.bundle, a.replicas, a.slots, a.num_cpus, a.num_gpus), a.host, a.port)
    print(f"serving {a.bundle} on {url} ({a.replicas} replicas x {a.slots} slots)", flush=True)
    try:
        if a.check:
            import openai

            c = openai.OpenAI(base_url=url, api_key="unused")
            mid = c.models.list().data[0].id
            r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8)
            print(repr(r.choices[0].message.content), r.usage)
            return
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
