"""Peer benchmark: FlashInfer's MLA decode/verify kernel against ours on the same cache, shapes and timing.

Peer: FlashInfer 0.6.0's ``BatchMLAPagedAttentionWrapper`` (backend "fa3", the sm_90a kernel its "auto" picks
on Hopper, and "fa2"). Ours: ``sglang_eagle3.kernels.mla_attention.triton_mla_attention``. Shapes: a
Kimi-K2.5 TP=8 rank (8 of 64 heads, kv_lora 512, rope 64, bf16, page 64), every request holding ``ctx`` tokens
of which ``T`` are the queries (T=1 decode; T>1 verify, causal: query i sees keys up to ctx - T + i).

Same data for both: one latent cache [slots, 576] (slot = page * 64 + offset; latent then rope key) with a
shuffled page table per input set. FlashInfer takes ckv [pages, page_size, 512] and kpe [pages, page_size, 64]
with any page and token strides, so both are views of our storage (no copy; a contiguous copy is tried only if
the views fail: ``peer_cache_layout`` says which ran). The page table becomes kv_indptr / kv_indices (each
request's first ceil(len / page) pages, in order) and kv_len.

Timing: benchmarks/bench_kernels.py's helpers, imported: one call per input set, the sets rotated so that the
working set is >= 3x the L2 where --max-sets allows (default 64 sets: 75 MB at B=1 1k, above the H200's 50 MB
L2 but not 3x; bench_kernels.py caps at 32), all captured in one CUDA graph; median of the replays divided by
the calls; copy bandwidth measured in the same run. GB/s count the cache read once (B x ctx x 576 x 2 bytes),
not q and out (bench_kernels.py adds those: ~1.5% more at 1k). Outputs are checked on set 0 against
``ref_mla_attention`` (relative error < 1e-2, as tests/kernels/test_kernels_gpu.py); each kernel's max abs
error is recorded.

FlashInfer compiles its kernels with nvcc on first use (one module per backend: ~20 s each on 2 CPU cores here).
That compile runs in child processes started first (logs: ``DIR/peer_jit_<backend>.log``) while our Triton
kernels compile and are checked; a child still running after --max-jit-seconds is killed and its cases record
why. Every FlashInfer failure (import, compile, plan, run, wrong output) is recorded per case as text in
``peer_error`` / ``peer_by_backend``; ours is timed regardless, before any FlashInfer kernel runs.

    python benchmarks/bench_peer_mla.py --out DIR [--contexts 1024 8192 32768] [--batch 1] [--tokens 1 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import HEADS, KV_LORA, ROPE, copy_bandwidth, log, sets_for, time_graph  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.config import yarn_get_mscale  # noqa: E402
from sglang_eagle3.kernels.mla_attention import triton_mla_attention  # noqa: E402
from sglang_eagle3.kernels.ref import ref_mla_attention  # noqa: E402

DEVICE = "cuda"
PAGE_SIZE = 64
# ModelConfig.softmax_scale for Kimi-K2.5: qk_head_dim 192 (128 nope + 64 rope), YaRN factor 64,
# mscale_all_dim 1. Any fixed value would do: both kernels get the same.
SM_SCALE = 192 ** -0.5 * yarn_get_mscale(64.0, 1.0) ** 2
REL_TOL = 1e-2  # tests/kernels/test_kernels_gpu.py::test_mla_attention
BACKENDS = ("fa3", "fa2")
FLOAT_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-KV scratch, shared by every wrapper
DEFAULT_WORKSPACE = "/tmp/flashinfer_ws"


# ------------------------------------------------------------------------------------------------- layout
def flashinfer_cache_views(kv_cache: torch.Tensor, page_size: int, kv_lora_rank: int):
    """Our cache [slots, Dc + Dr] as FlashInfer's ckv [pages, page_size, Dc] and kpe [pages, page_size, Dr]:
    views of the same storage (page stride page_size * (Dc + Dr), token stride Dc + Dr)."""
    slots, width = kv_cache.shape
    assert slots % page_size == 0, f"{slots=} is not a whole number of pages of {page_size=}"
    assert 0 < kv_lora_rank < width, f"{kv_lora_rank=} must split the cache width {width}"
    paged = kv_cache.view(slots // page_size, page_size, width)
    return paged[..., :kv_lora_rank], paged[..., kv_lora_rank:]


def flashinfer_page_args(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """Our page table [B, P] and seq_lens [B] -> FlashInfer's kv_indptr [B + 1], kv_indices [pages used] and
    kv_len [B] (int32, on the table's device): request b's first ceil(seq_lens[b] / page_size) pages, in order.
    NOTE: reads seq_lens on the host (a sync); call it when planning, never under graph capture."""
    B, P = page_table.shape
    assert seq_lens.shape == (B,), f"{tuple(seq_lens.shape)=} does not match {B=} requests"
    used = (seq_lens.long() + page_size - 1) // page_size  # [B]
    assert int(used.max()) <= P, f"seq_lens need {int(used.max())} pages, the table has {P}"
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=page_table.device)
    kv_indptr[1:] = used.cumsum(0)
    mask = torch.arange(P, device=page_table.device)[None, :] < used[:, None]  # [B, P]
    kv_indices = page_table[mask].to(torch.int32)  # row-major: request by request, pages in order
    return kv_indptr, kv_indices, seq_lens.to(torch.int32)


# ------------------------------------------------------------------------------------------------- cases
@dataclass
class MlaCase:
    """``sets`` input sets of B requests x T query tokens over ``ctx`` keys each; one cache, disjoint pages."""

    B: int
    T: int
    ctx: int
    sets: int
    qn: torch.Tensor  # [S, B*T, H, Dc]
    qr: torch.Tensor  # [S, B*T, H, Dr]
    kv: torch.Tensor  # [S*B*P*page, Dc + Dr]
    pages: torch.Tensor  # [S, B, P] int32
    seq: torch.Tensor  # [B] int32
    ref: torch.Tensor | None = None  # ref_mla_attention on set 0, [B*T, H, Dc]
    record: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"B={self.B} T={self.T} ctx={self.ctx}"

    @property
    def cache_bytes(self) -> int:
        return self.B * self.ctx * (KV_LORA + ROPE) * 2


def make_case(B: int, T: int, ctx: int, max_sets: int) -> MlaCase:
    """Inputs as bench_kernels.mla_case makes them (it keeps its tensors inside closures, so the peer cannot
    reach them): a shuffled page table per set over one cache, q scaled to 0.05."""
    torch.manual_seed(1_000_003 * B + 1009 * T + ctx)
    cache_bytes = B * ctx * (KV_LORA + ROPE) * 2
    S = sets_for(cache_bytes, cap=max(max_sets, 2))
    P = -(-ctx // PAGE_SIZE)
    pages = torch.randperm(S * B * P, device=DEVICE).int().view(S, B, P)
    kv = torch.randn(S * B * P * PAGE_SIZE, KV_LORA + ROPE, device=DEVICE, dtype=torch.bfloat16)
    seq = torch.full((B,), ctx, dtype=torch.int32, device=DEVICE)
    qn = torch.randn(S, B * T, HEADS, KV_LORA, device=DEVICE, dtype=torch.bfloat16) * 0.05
    qr = torch.randn(S, B * T, HEADS, ROPE, device=DEVICE, dtype=torch.bfloat16) * 0.05
    return MlaCase(B, T, ctx, S, qn, qr, kv, pages, seq)


def mla_kwargs(T: int) -> dict:
    return dict(tokens_per_req=T, page_size=PAGE_SIZE, kv_lora_rank=KV_LORA, sm_scale=SM_SCALE)


def ours_calls(c: MlaCase) -> list:
    kw = mla_kwargs(c.T)
    return [lambda i=i: triton_mla_attention(c.qn[i], c.qr[i], c.kv, c.pages[i], c.seq, **kw) for i in range(c.sets)]


def errors_vs(out: torch.Tensor, ref: torch.Tensor) -> tuple[float | None, float | None]:
    """(max abs error, relative error ||out - ref|| / ||ref||: the GPU tests' measure) in float64; (None, None)
    when out holds NaN or inf (JSON has no infinity)."""
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return None, None
    diff = out.double() - ref.double()
    return diff.abs().max().item(), (diff.norm() / ref.double().norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------------------------- FlashInfer
def _loaded_library(prefix: str) -> str | None:
    """Path of a shared library this process has loaded whose file name starts with ``prefix``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(prefix):
                    return parts[5].strip()
    except OSError:
        pass
    return None


def _cuda_home() -> str | None:
    """The toolkit for FlashInfer's JIT: $CUDA_HOME / $CUDA_PATH, else /usr/local/cuda(-*), else nvcc's grandparent.
    NOTE: left alone, FlashInfer takes `which nvcc`'s grandparent; where nvcc is a wrapper script in
    /usr/local/bin (as on this project's CPU machine) that is /usr/local, without lib64/libcudart.so, and the
    module's link step fails."""
    versioned = sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda", *versioned):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(home)
    nvcc = shutil.which("nvcc")
    return str(Path(os.path.realpath(nvcc)).parents[1]) if nvcc else None


def prepare_jit_env(workspace: str) -> dict:
    """Sets (where unset) what FlashInfer's JIT needs on a bare machine without network; returns what it set.
    Call after CUDA is initialised (the driver library it links against is found among the loaded ones)."""
    done: dict[str, str] = {}

    def put(key: str, value: str) -> None:
        if key not in os.environ:
            os.environ[key] = done[key] = value

    put("FLASHINFER_WORKSPACE_BASE", workspace)  # kernels land in <it>/.cache/flashinfer/<version>/<arch>
    put("TVM_FFI_CACHE_DIR", str(Path(workspace) / "tvm-ffi"))
    if not any(hasattr(torch.Tensor, a) for a in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")):
        # Else tvm-ffi builds a torch extension at import; without it torch tensors pass through __dlpack__ and
        # tvm-ffi still launches on torch's current stream (what graph capture needs).
        put("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    home = _cuda_home()
    if home:
        put("CUDA_HOME", home)
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is not None:
        import ninja

        os.environ["PATH"] = done["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ['PATH']}"
    # FlashInfer links with -L$CUDA_HOME/lib64{,/stubs} -lcudart -lcuda. A toolkit assembled from wheels has no
    # stubs/libcuda.so, and a driver may come as libcuda.so.1 only: link against the libraries loaded here.
    links = Path(workspace) / "link"
    wanted = {"libcuda.so": _loaded_library("libcuda.so")}
    if not home or not (Path(home) / "lib64" / "libcudart.so").exists():
        wanted["libcudart.so"] = _loaded_library("libcudart.so")
    made = False
    for name, target in wanted.items():
        if target is None:
            continue
        links.mkdir(parents=True, exist_ok=True)
        link = links / name
        if not (link.is_symlink() and os.readlink(link) == target):
            tmp = links / f".{name}.{os.getpid()}"  # atomic swap: the compile children call this too
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            os.replace(tmp, link)
        made = True
    if made and f"-L{links}" not in os.environ.get("FLASHINFER_EXTRA_LDFLAGS", ""):
        os.environ["FLASHINFER_EXTRA_LDFLAGS"] = done["FLASHINFER_EXTRA_LDFLAGS"] = (
            f"{os.environ.get('FLASHINFER_EXTRA_LDFLAGS', '')} -L{links}".strip())
    return done


def import_flashinfer():
    """(module, None) or (None, why not)."""
    try:
        import flashinfer
        import flashinfer.mla  # noqa: F401

        return flashinfer, None
    except Exception as exc:  # ImportError, or whatever its import-time probing raises
        return None, f"import flashinfer failed: {exc!r}\n{traceback.format_exc()[-2000:]}"


def plan_wrapper(fi, backend: str, float_ws: torch.Tensor, page_table: torch.Tensor, seq: torch.Tensor, T: int):
    """A BatchMLAPagedAttentionWrapper planned for one input set (its plan holds that set's page list)."""
    B = page_table.shape[0]
    kv_indptr, kv_indices, kv_len = flashinfer_page_args(page_table, seq, PAGE_SIZE)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=page_table.device) * T
    wrapper = fi.mla.BatchMLAPagedAttentionWrapper(float_ws, backend=backend)
    wrapper.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len,
                 num_heads=HEADS, head_dim_ckv=KV_LORA, head_dim_kpe=ROPE, page_size=PAGE_SIZE, causal=T > 1,
                 sm_scale=SM_SCALE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return wrapper


def jit_child(backend: str) -> int:
    """``--jit-only BACKEND``: build (or find in the cache) FlashInfer's MLA module by planning a 1-token call."""
    t0 = time.time()
    torch.cuda.init()
    prepare_jit_env(DEFAULT_WORKSPACE)
    fi, err = import_flashinfer()
    if fi is None:
        log(err)
        return 1
    log(f"flashinfer {fi.__version__}: building the {backend} MLA module (nvcc; the first time takes a while) "
        f"under {os.environ['FLASHINFER_WORKSPACE_BASE']}")
    float_ws = torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=DEVICE)
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    plan_wrapper(fi, backend, float_ws, table, torch.ones(1, dtype=torch.int32, device=DEVICE), 1)
    torch.cuda.synchronize()
    log(f"built {backend} in {time.time() - t0:.1f}s")
    return 0


@dataclass
class JitJob:
    backend: str
    proc: subprocess.Popen | None
    log_path: Path
    started: float
    status: dict = field(default_factory=dict)  # ok, seconds, error


def start_jit(backends: list[str], out: Path) -> dict[str, JitJob]:
    """One child per backend, each in its own process group (killable with its ninja/nvcc)."""
    jobs = {}
    for backend in backends:
        log_path = out / f"peer_jit_{backend}.log"
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--jit-only", backend],
                                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        jobs[backend] = JitJob(backend, proc, log_path, time.time())
    return jobs


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as exc:
        return f"(no log: {exc!r})"


def kill_job(job: JitJob) -> None:
    if job.proc is not None and job.proc.poll() is None:
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.proc.wait()


def wait_jit(jobs: dict[str, JitJob], deadline: float) -> None:
    """Waits for every child until ``deadline``; kills the late ones. Fills each job's status."""
    done_at: dict[str, float] = {}
    last_note = time.time()
    while len(done_at) < len(jobs):
        for backend, job in jobs.items():
            if backend not in done_at and job.proc.poll() is not None:
                done_at[backend] = time.time()
        if len(done_at) == len(jobs) or time.time() >= deadline:
            break
        time.sleep(0.25)
        if time.time() - last_note > 15:
            running = [f"{b} {time.time() - j.started:.0f}s" for b, j in jobs.items() if b not in done_at]
            log(f"  still compiling FlashInfer: {', '.join(running)} (limit {deadline - time.time():.0f}s more)")
            last_note = time.time()
    for backend, job in jobs.items():
        seconds = round(done_at.get(backend, time.time()) - job.started, 1)
        if backend not in done_at:
            kill_job(job)
            job.status = {"ok": False, "seconds": seconds, "error": "JIT compile not done after "
                          f"--max-jit-seconds; killed. Log tail:\n{_tail(job.log_path)}"}
        elif job.proc.returncode != 0:
            job.status = {"ok": False, "seconds": seconds,
                          "error": f"JIT child exited {job.proc.returncode}. Log tail:\n{_tail(job.log_path)}"}
        else:
            job.status = {"ok": True, "seconds": seconds, "error": None}
        log(f"  FlashInfer {backend}: {'ready' if job.status['ok'] else 'FAILED'} after {seconds}s "
            f"(log {job.log_path})")


def _peer_attempt(fi, backend: str, c: MlaCase, float_ws: torch.Tensor, ours_out: torch.Tensor | None,
                  replays: int, layout: str) -> dict:
    """One try of a backend on case ``c`` with ckv/kpe as views of our cache ("shared") or contiguous copies of
    them ("copied"): check set 0, then time, unless a shared run misses the tolerance (the copy is tried next)."""
    ckv, kpe = flashinfer_cache_views(c.kv, PAGE_SIZE, KV_LORA)
    if layout == "copied":
        ckv, kpe = ckv.contiguous(), kpe.contiguous()
    wrappers = [plan_wrapper(fi, backend, float_ws, c.pages[i], c.seq, c.T) for i in range(c.sets)]
    out = wrappers[0].run(c.qn[0], c.qr[0], ckv, kpe)
    torch.cuda.synchronize()
    abs_ref, rel_ref = errors_vs(out, c.ref)
    rec = {"layout": layout, "max_abs_err_vs_ref": abs_ref, "rel_err_vs_ref": rel_ref,
           "ok": rel_ref is not None and rel_ref < REL_TOL,
           "max_abs_err_vs_ours": None if ours_out is None else errors_vs(out, ours_out)[0]}
    if rec["ok"] or layout == "copied":
        calls = [lambda i=i: wrappers[i].run(c.qn[i], c.qr[i], ckv, kpe) for i in range(c.sets)]
        rec["us"] = time_graph(calls, replays=replays)
        rec["gbps"] = c.cache_bytes / rec["us"] / 1e3
    return rec


def peer_backend(fi, backend: str, c: MlaCase, float_ws: torch.Tensor, ours_out: torch.Tensor | None,
                 replays: int) -> dict:
    """Check then time one FlashInfer backend on case ``c``: on our cache's views first, on contiguous copies
    only if the views raise or miss the tolerance. Never raises: failures come back as text in "error"."""
    rec: dict = {"backend": backend, "us": None, "error": None, "layout": None}
    notes = []
    for layout in ("shared", "copied"):
        try:
            attempt = _peer_attempt(fi, backend, c, float_ws, ours_out, replays, layout)
        except Exception as exc:
            notes.append(f"{layout} cache: {exc!r}\n{traceback.format_exc()[-1500:]}")
            continue
        finally:
            torch.cuda.empty_cache()
        rec.update(attempt)
        if not attempt["ok"]:
            rel = attempt["rel_err_vs_ref"]
            notes.append(f"{layout} cache: output {'has NaN/inf' if rel is None else f'rel err {rel:.3g}'} "
                         f"vs reference (tolerance {REL_TOL})")
        if attempt.get("us") is not None:
            break
    rec["error"] = "\n".join(notes) or None
    return rec


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (peer_mla.json, peer_jit_<backend>.log)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768], help="tokens per request")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="requests per call")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1],
                    help="query tokens per request: 1 = decode, k+1 = verify (causal)")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), help="FlashInfer backends")
    ap.add_argument("--max-jit-seconds", type=float, default=180.0,
                    help="give up on FlashInfer's nvcc compile after this long (from the start of the run)")
    ap.add_argument("--max-sets", type=int, default=64, help="most input sets rotated per case")
    ap.add_argument("--replays", type=int, default=30, help="timed graph replays per case (median)")
    ap.add_argument("--no-peer", action="store_true", help="time ours only")
    ap.add_argument("--jit-only", choices=BACKENDS, help=argparse.SUPPRESS)  # the compile child
    args = ap.parse_args(argv)
    if args.jit_only is None and args.out is None:
        ap.error("--out is required")
    for name in ("contexts", "batch", "tokens"):
        if min(getattr(args, name)) < 1:
            ap.error(f"--{name} values must be >= 1, got {getattr(args, name)}")
    if min(args.contexts) < max(args.tokens):
        ap.error(f"every context must hold the query tokens: {args.contexts=} {args.tokens=}")
    return args


def print_table(cases: list[MlaCase]) -> None:
    head = (f"{'case':<22}{'ours us':>9}{'peer us':>9}  {'peer':<5}{'ours GB/s':>10}{'peer GB/s':>10}"
            f"{'ours/copy':>10}{'peer/copy':>10}{'err ours':>10}{'err peer':>10}")
    log(head)
    log("-" * len(head))

    def num(v, fmt):
        width = int(fmt.split(".")[0])
        return format(v, fmt) if isinstance(v, (int, float)) else "-".rjust(width)

    for c in cases:
        r = c.record
        log(f"{c.name:<22}{num(r.get('ours_us'), '9.2f')}{num(r.get('peer_us'), '9.2f')}  "
            f"{r.get('peer_backend') or '-':<5}{num(r.get('ours_gbps'), '10.0f')}{num(r.get('peer_gbps'), '10.0f')}"
            f"{num(r.get('ours_frac_of_copy_bw'), '10.1%')}{num(r.get('peer_frac_of_copy_bw'), '10.1%')}"
            f"{num(r.get('max_abs_err_ours_vs_ref'), '10.2e')}{num(r.get('max_abs_err_peer_vs_ref'), '10.2e')}")
        if r.get("peer_error"):
            log(f"{'':<22}peer error: {r['peer_error'].splitlines()[0][:150]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.jit_only:
        return jit_child(args.jit_only)
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    jit_env = prepare_jit_env(DEFAULT_WORKSPACE)
    jobs: dict[str, JitJob] = {}
    peer_unavailable = "--no-peer" if args.no_peer else None
    if peer_unavailable is None and importlib.util.find_spec("flashinfer") is None:
        peer_unavailable = ("flashinfer is not installed (install the wheels in .whl/: benchmarks/peer/"
                            "fetch_wheels.sh)")
    if peer_unavailable is None:
        log(f"FlashInfer JIT compile of MLA ({', '.join(args.backends)}) starts now in the background: the first "
            f"run compiles with nvcc and may take minutes (limit {args.max_jit_seconds:.0f}s); kernels cached under "
            f"{os.environ['FLASHINFER_WORKSPACE_BASE']}; env set here: {jit_env}")
        jobs = start_jit(args.backends, args.out)

    try:
        return run(args, t_start, jit_env, jobs, peer_unavailable)
    finally:
        for job in jobs.values():
            kill_job(job)


def run(args, t_start: float, jit_env: dict, jobs: dict[str, JitJob], peer_unavailable: str | None) -> int:
    from sglang_eagle3.kernels import tuning

    arch, sms, gpu = tuning.device_key(torch.cuda.current_device())
    commit = git_commit()
    cases = [make_case(B, T, ctx, args.max_sets) for B in args.batch for T in args.tokens for ctx in args.contexts]
    result = {
        "command": "python " + " ".join(sys.argv),
        "git_commit": commit,
        "gpu": gpu, "arch": arch, "sm_count": sms,
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "flashinfer": None, "tvm_ffi": None, "flashinfer_auto_backend": None,
        "copy_gbps": None, "copy_gbps_by_method": None,
        "sm_scale": SM_SCALE, "page_size": PAGE_SIZE, "heads": HEADS, "kv_lora": KV_LORA, "rope": ROPE,
        "method": "one call per rotated input set (separate page tables over one cache, working set >= 3x L2 "
                  "where --max-sets allows) captured in one CUDA graph, median of replays / calls "
                  "(benchmarks/bench_kernels.py time_graph); GB/s over the cache read once (B x ctx x 576 x 2)",
        "peer_cache_layout": "shared: FlashInfer's ckv/kpe are strided views of our [slots, 576] cache (no copy); "
                             "'copied' per case only where the views failed",
        "jit": {}, "jit_env": jit_env, "peer_unavailable": peer_unavailable,
        "cases": [],
    }
    out_json = args.out / "peer_mla.json"

    def write() -> None:
        result["cases"] = [{"name": c.name, **c.record} for c in cases]
        out_json.write_text(json.dumps(result, indent=1))

    for c in cases:
        c.record.update(B=c.B, T=c.T, ctx=c.ctx, H=HEADS, kv_lora=KV_LORA, rope=ROPE, page=PAGE_SIZE, sets=c.sets,
                        working_set_mb=round(c.sets * c.cache_bytes / 2**20, 1), bytes=c.cache_bytes,
                        ours_us=None, peer_us=None, ours_gbps=None, peer_gbps=None, ours_frac_of_copy_bw=None,
                        peer_frac_of_copy_bw=None, peer_backend=None, max_abs_err_peer_vs_ref=None,
                        max_abs_err_ours_vs_ref=None, max_abs_err_peer_vs_ours=None, rel_err_peer_vs_ref=None,
                        rel_err_ours_vs_ref=None, peer_ok=None, ours_ok=None, peer_cache_layout=None,
                        peer_error=peer_unavailable, ours_error=None, peer_by_backend={})
    write()

    # 1. While FlashInfer compiles: our kernels compile (Triton) and are checked against the reference.
    ours_out: dict[str, torch.Tensor] = {}
    for c in cases:
        log(f"== check ours {c.name} ({c.sets} sets, {c.record['working_set_mb']} MB)")
        try:
            c.ref = ref_mla_attention(c.qn[0], c.qr[0], c.kv, c.pages[0], c.seq, **mla_kwargs(c.T))
            out = ours_calls(c)[0]()
            torch.cuda.synchronize()
            abs_err, rel = errors_vs(out, c.ref)
            ours_out[c.name] = out
            c.record.update(max_abs_err_ours_vs_ref=abs_err, rel_err_ours_vs_ref=rel,
                            ours_ok=rel is not None and rel < REL_TOL)
        except Exception as exc:
            c.record["ours_error"] = f"{exc!r}\n{traceback.format_exc()[-2000:]}"
            log(f"ours failed on {c.name}:\n{traceback.format_exc()}")
    write()

    fi = None
    if jobs:
        log("== waiting for FlashInfer's JIT compile")
        wait_jit(jobs, t_start + args.max_jit_seconds)
        result["jit"] = {b: j.status for b, j in jobs.items()}
        if any(j.status["ok"] for j in jobs.values()):
            fi, err = import_flashinfer()
            if fi is None:
                result["peer_unavailable"] = err
            else:
                import tvm_ffi
                from flashinfer.utils import determine_mla_backend

                result["flashinfer"], result["tvm_ffi"] = fi.__version__, tvm_ffi.__version__
                result["flashinfer_auto_backend"] = determine_mla_backend(torch.device(DEVICE))
        write()

    # 2. Copy bandwidth, then ours on every case (before any FlashInfer kernel runs: a fault there cannot
    # take our numbers with it).
    copy_ways = copy_bandwidth()
    copy_gbps = max(copy_ways.values())
    result["copy_gbps"], result["copy_gbps_by_method"] = round(copy_gbps, 1), copy_ways
    log(f"copy bandwidth {copy_gbps:.0f} GB/s ({copy_ways}) on {gpu} ({arch}, {sms} SMs)")
    for c in cases:
        if c.record["ours_error"]:
            continue
        try:
            us = time_graph(ours_calls(c), replays=args.replays)
            gbps = c.cache_bytes / us / 1e3
            c.record.update(ours_us=round(us, 3), ours_gbps=round(gbps, 1),
                            ours_frac_of_copy_bw=round(gbps / copy_gbps, 4))
            log(f"ours {c.name:<22} {us:8.2f} us {gbps:7.0f} GB/s {gbps / copy_gbps:6.1%}")
        except Exception as exc:
            c.record["ours_error"] = f"{exc!r}\n{traceback.format_exc()[-2000:]}"
            log(f"ours timing failed on {c.name}:\n{traceback.format_exc()}")
        write()

    # 3. FlashInfer, every ready backend on every case.
    float_ws = torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=DEVICE) if fi is not None else None
    for c in cases:
        by_backend = c.record["peer_by_backend"]
        for backend, job in jobs.items():
            if not job.status.get("ok") or fi is None:
                why = job.status.get("error") or result["peer_unavailable"] or "flashinfer unavailable"
                by_backend[backend] = {"backend": backend, "us": None, "error": why}
                continue
            if c.ref is None:
                by_backend[backend] = {"backend": backend, "us": None, "error": "no reference (see ours_error)"}
                continue
            rec = peer_backend(fi, backend, c, float_ws, ours_out.get(c.name), args.replays)
            by_backend[backend] = rec
            if rec["us"] is not None:
                err = rec["max_abs_err_vs_ref"]
                log(f"flashinfer {backend} {c.name:<22} {rec['us']:8.2f} us {rec['gbps']:7.0f} GB/s "
                    f"{rec['gbps'] / copy_gbps:6.1%} (max abs err vs ref {'NaN/inf' if err is None else f'{err:.2e}'}"
                    f", {rec['layout']} cache{'' if rec['ok'] else ', FAILED the check'})")
            else:
                log(f"flashinfer {backend} {c.name}: failed: {(rec['error'] or '').splitlines()[0][:300]}")
        summarize_peer(c, copy_gbps)
        write()

    log(f"== {len(cases)} cases in {time.time() - t_start:.0f}s; {out_json}")
    print_table(cases)
    write()
    return 0


def summarize_peer(c: MlaCase, copy_gbps: float) -> None:
    """The case's peer_* fields: the fastest backend that passed the check, else the fastest that ran (peer_ok
    False), else none and every backend's error in peer_error."""
    recs = [r for r in c.record["peer_by_backend"].values() if r.get("us") is not None]
    if not recs:
        errors = [f"[{r['backend']}] {r['error']}" for r in c.record["peer_by_backend"].values() if r.get("error")]
        c.record["peer_error"] = "\n".join(errors) or c.record["peer_error"]
        return
    passed = [r for r in recs if r.get("ok")]
    best = min(passed or recs, key=lambda r: r["us"])
    gbps = c.cache_bytes / best["us"] / 1e3
    c.record.update(peer_us=round(best["us"], 3), peer_gbps=round(gbps, 1),
                    peer_frac_of_copy_bw=round(gbps / copy_gbps, 4), peer_backend=best["backend"],
                    peer_ok=best.get("ok"), peer_cache_layout=best.get("layout"),
                    max_abs_err_peer_vs_ref=best.get("max_abs_err_vs_ref"),
                    rel_err_peer_vs_ref=best.get("rel_err_vs_ref"),
                    max_abs_err_peer_vs_ours=best.get("max_abs_err_vs_ours"),
                    peer_error=None if best.get("ok") else best.get("error"))
    for r in c.record["peer_by_backend"].values():
        if r.get("us") is not None:
            r["us"], r["gbps"] = round(r["us"], 3), round(r["gbps"], 1)


if __name__ == "__main__":
    sys.exit(main())
