"""Issue 31's framework figures, one part per process (JAX and PyTorch do not share a GPU well):

  jax_step   a jitted step of a few elementwise ops and a reduction on small arrays, steady
             state: the median of 2000 calls, each waited for (block_until_ready)
  mem_info   torch.cuda.mem_get_info() in a loop: the median of 2000 calls, idle and while
             the stream is busy with a queue of small kernels
  prefill    a randomly initialised decoder (transformers' Llama, no download): generate a few
             tokens at one shape, then five prefill passes at a new shape (8 x 512); the first
             pass loads the new shape's kernels (CUDA_MODULE_LOADING=LAZY, the default)

Prints "FIG name value unit" lines (figures, compared by the caller, not checked here) and
"OK part" when the part's results were right; with SPEED_PROBE_PROFILE set, "PROF" lines: the
functions generate spent its time in (cProfile, by own time); SPEED_PROBE_NO_CUDNN_SDPA set
keeps cuDNN out of attention.
usage: speed_probe.py PART...
"""
import cProfile
import io
import os
import pstats
import resource
import statistics
import sys
import time


def fig(name, value, unit):
    print(f"FIG {name} {value:.3f} {unit}", flush=True)


def jax_step():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(x, y):
        z = jnp.tanh(x * 1.5 + y)
        w = z * z - 0.25 * y
        return jnp.sum(w), w

    x = jnp.linspace(0.0, 1.0, 4096, dtype=jnp.float32)
    y = jnp.ones(4096, dtype=jnp.float32)
    for _ in range(50):
        s, w = step(x, y)
        s.block_until_ready()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        s, w = step(x, w)
        s.block_until_ready()
        times.append((time.perf_counter() - t0) * 1e6)
    fig("jax.small_step.median", statistics.median(times), "us")
    ok = bool(jnp.isfinite(s))
    print("OK jax_step" if ok else "BAD jax_step", flush=True)


def mem_info():
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    ok = 0 < free <= total
    for _ in range(100):
        torch.cuda.mem_get_info()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        torch.cuda.mem_get_info()
        times.append((time.perf_counter() - t0) * 1e6)
    fig("torch.mem_get_info.idle.median", statistics.median(times), "us")
    # While the stream has work queued: a few hundred small kernels ahead.
    a = torch.ones(1 << 16, device="cuda")
    times = []
    for _ in range(200):
        for _ in range(20):
            a.mul_(1.0000001)
        t0 = time.perf_counter()
        torch.cuda.mem_get_info()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    fig("torch.mem_get_info.busy.median", statistics.median(times), "us")
    print("OK mem_info" if ok else "BAD mem_info", flush=True)


def prefill():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if os.environ.get("SPEED_PROBE_NO_CUDNN_SDPA"):
        torch.backends.cuda.enable_cudnn_sdp(False)  # attention by the other backends
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.float16).eval()
    torch.cuda.synchronize()
    fig("prefill.model_to_gpu", time.perf_counter() - t0, "s")
    with torch.no_grad():
        ids = torch.randint(0, 32000, (1, 16), device="cuda")
        t0 = time.perf_counter()
        prof = cProfile.Profile() if os.environ.get("SPEED_PROBE_PROFILE") else None
        ru0, th0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
        if prof:
            prof.enable()
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
        torch.cuda.synchronize()
        if prof:
            prof.disable()
        fig("prefill.generate_1x16", time.perf_counter() - t0, "s")
        # Where the time went, coarsely: the calling thread's CPU time, the process's user and
        # system time, its context switches and page faults, and its threads.
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        fig("prefill.generate_thread_cpu", time.thread_time() - th0, "s")
        fig("prefill.generate_user_cpu", ru1.ru_utime - ru0.ru_utime, "s")
        fig("prefill.generate_sys_cpu", ru1.ru_stime - ru0.ru_stime, "s")
        fig("prefill.generate_minor_faults", ru1.ru_minflt - ru0.ru_minflt, "")
        fig("prefill.generate_voluntary_switches", ru1.ru_nvcsw - ru0.ru_nvcsw, "")
        fig("prefill.generate_involuntary_switches", ru1.ru_nivcsw - ru0.ru_nivcsw, "")
        fig("prefill.threads", len(os.listdir("/proc/self/task")), "")
        if prof:
            # Where generate's time went, by function's own time (PROF lines; not compared).
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            for line in text.getvalue().splitlines():
                if line.strip():
                    print("PROF " + line, flush=True)
        batch = torch.randint(0, 32000, (8, 512), device="cuda")
        passes = []
        for _ in range(5):
            t0 = time.perf_counter()
            logits = model(batch).logits
            torch.cuda.synchronize()
            passes.append(time.perf_counter() - t0)
    fig("prefill.first_8x512", passes[0], "s")
    fig("prefill.steady_8x512", statistics.median(passes[1:]), "s")
    ok = out.shape == (1, 32) and logits.shape == (8, 512, 32000) and bool(torch.isfinite(logits.float()).all())
    print("OK prefill" if ok else "BAD prefill", flush=True)


PARTS = {"jax_step": jax_step, "mem_info": mem_info, "prefill": prefill}

if __name__ == "__main__":
    for p in sys.argv[1:] or PARTS:
        PARTS[p]()
