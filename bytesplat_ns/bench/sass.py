r"""``bytesplat-bench sass``: the compositing loops' instruction counts in the machine code nvcc writes
for a GPU architecture, without a GPU.

    bytesplat-bench sass --arch 90 --sources render_fwd.cu render_bwd.cu fused_loss.cu --out sass.json

Each source of ``cuda/`` is compiled as the JIT build compiles it (``raster._build``'s nvcc flags,
torch's headers) to a cubin for ``sm_ARCH``, with ptxas' resource report; ``cuobjdump -sass``
disassembles it. Per kernel instance (its template switches by name): registers, spill stores and
loads (bytes), instructions in all, and the instructions of each compositing loop, the innermost loop
around a ``MUFU.EX2`` (the Gaussian's falloff), counted once over the loop body (every path, not a
trace): the forward's, then the backward's in a kernel that has both; and the local-memory accesses
(spills) inside those loops. The render kernels are bound by the instructions they issue (Nsight
Compute: ``bytesplat-bench dram --kernels``), so a change to the per-pixel work shows in the loop's
size before it is timed on a GPU. ``cuobjdump`` is taken from next to nvcc, the PATH, or the copy
triton ships.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# the template switches of each kernel, in template order
SWITCHES: Dict[str, Tuple[str, ...]] = {
    "render_fwd_kernel": ("fast_exp",),
    "render_bwd_kernel": ("absgrad", "butterfly", "contribution", "fast_exp"),
    "render_bwd_2px_kernel": ("absgrad", "fast_exp"),
    "fused_loss_kernel": ("absgrad", "butterfly", "contribution", "fast_exp"),
}
DEFAULT_SOURCES = ("render_fwd.cu", "render_bwd.cu", "fused_loss.cu")

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b(?:\s+!?U?P\d,)?\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def find_tool(name: str, nvcc: Optional[str]) -> Optional[str]:
    """``name`` (a CUDA binary utility) next to nvcc, on the PATH, or in triton's bundled copy."""
    if nvcc:
        beside = Path(nvcc).resolve().parent / name
        if beside.exists():
            return str(beside)
    if shutil.which(name):
        return shutil.which(name)
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.exists() else None


def compile_command(nvcc: str, source: Path, cubin: Path, arch: str) -> List[str]:
    from bytesplat_ns.raster._build import cuda_source_dir, include_paths, nvcc_flags

    import torch

    flags = [f for f in nvcc_flags(arch) if not f.startswith("-gencode")]
    return [nvcc, "-cubin", f"-arch=sm_{arch}", *flags, "-Xptxas", "-v",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-DTORCH_EXTENSION_NAME=bytesplat_cuda",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *[f"-I{p}" for p in (*include_paths(), str(cuda_source_dir()))],
            "-o", str(cubin), str(source)]


def parse_resources(ptxas_log: str) -> Dict[str, Dict[str, int]]:
    """ptxas -v's report: mangled kernel name -> registers, spill_stores, spill_loads (bytes)."""
    out: Dict[str, Dict[str, int]] = {}
    current = None
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
    return out


def parse_sass(text: str) -> Dict[str, List[Tuple[int, str]]]:
    """cuobjdump -sass: mangled kernel name -> its instructions as (address, text)."""
    out: Dict[str, List[Tuple[int, str]]] = {}
    current: Optional[List[Tuple[int, str]]] = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def compositing_loops(instructions: Sequence[Tuple[int, str]]) -> List[int]:
    """Instructions in each innermost loop (a backward branch and its target) around a MUFU.EX2, in
    address order: the forward's compositing loop, then the backward's where the kernel has both."""
    return [sum(1 for a, _ in instructions if lo <= a <= hi) for lo, hi in compositing_loop_spans(instructions)]


def loop_local_accesses(instructions: Sequence[Tuple[int, str]]) -> List[int]:
    """Local-memory loads and stores (LDL / STL: register spills) inside each compositing loop. ptxas
    reports a kernel's spill bytes wherever they are; in the loop they cost per Gaussian and pixel."""
    return [sum(1 for a, t in instructions if lo <= a <= hi and re.search(r"\b(LDL|STL)\b", t))
            for lo, hi in compositing_loop_spans(instructions)]


def compositing_loop_spans(instructions: Sequence[Tuple[int, str]]) -> List[Tuple[int, int]]:
    """(first, last) address of each innermost loop around a MUFU.EX2, in address order."""
    back_edges = []
    for address, text in instructions:
        m = _BRANCH.search(text)
        if m and m.group(1) is not None and int(m.group(1), 16) < address:
            back_edges.append((int(m.group(1), 16), address))
    loops = set()
    for ex2 in (a for a, t in instructions if "MUFU.EX2" in t):
        around = [(lo, hi) for lo, hi in back_edges if lo <= ex2 < hi]
        if around:
            loops.add(min(around, key=lambda e: e[1] - e[0]))
    return sorted(loops)


def kernel_name(mangled: str) -> Tuple[str, Dict[str, bool]]:
    """(kernel, its template switches) from an Itanium-mangled instance, e.g.
    ``_ZN9bytesplat..17render_bwd_kernelILb1ELb1ELb0ELb1EEEv..`` -> (render_bwd_kernel, absgrad ... fast_exp)."""
    rest = mangled[3:] if mangled.startswith("_ZN") else mangled
    name = mangled
    while True:  # the nested name: length-prefixed parts; the kernel's is the last
        m = re.match(r"(\d+)", rest)
        if not m:
            break
        n = int(m.group(1))
        name, rest = rest[len(m.group(1)):len(m.group(1)) + n], rest[len(m.group(1)) + n:]
    m = re.match(r"I((?:Lb[01]E)+)E", rest)
    values = [v == "1" for v in re.findall(r"Lb([01])E", m.group(1))] if m else []
    return name, dict(zip(SWITCHES.get(name, ()), values))


def measure_source(nvcc: str, cuobjdump: str, source: Path, arch: str) -> List[Dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / (source.stem + ".cubin")
        done = subprocess.run(compile_command(nvcc, source, cubin, arch), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source.name}:\n{done.stderr[-4000:]}")
        resources = parse_resources(done.stdout + done.stderr)
        dump = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
        if dump.returncode != 0:
            raise RuntimeError(f"cuobjdump failed on {cubin.name}: {dump.stderr[-2000:]}")
    rows = []
    for mangled, instructions in parse_sass(dump.stdout).items():
        kernel, switches = kernel_name(mangled)
        rows.append({"source": source.name, "kernel": kernel, "switches": switches,
                     "instructions": len(instructions), "loop_instructions": compositing_loops(instructions),
                     "loop_local_accesses": loop_local_accesses(instructions),
                     **resources.get(mangled, {})})
    return sorted(rows, key=lambda r: (r["kernel"], sorted(r["switches"].items())))


def nvcc_version(nvcc: str) -> str:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"release ([\d.]+), V([\d.]+)", done.stdout)
    return m.group(2) if m else "unknown"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench sass", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    p.add_argument("--arch", default="90", help="compute capability without the dot (90: H100/H200)")
    p.add_argument("--sources", nargs="+", default=list(DEFAULT_SOURCES), help="files of cuda/ to compile")
    p.add_argument("--out", type=Path, default=Path("sass.json"))
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from bytesplat_ns.errors import BytesplatError
    from bytesplat_ns.raster._build import _nvcc_path, cuda_source_dir

    nvcc = _nvcc_path()
    cuobjdump = find_tool("cuobjdump", nvcc)
    if nvcc is None or cuobjdump is None:
        raise BytesplatError(f"bytesplat-bench sass needs nvcc and cuobjdump (found: nvcc {nvcc}, cuobjdump {cuobjdump})",
                             hint="set CUDA_HOME to a CUDA toolkit")
    rows: List[Dict] = []
    for name in args.sources:
        source = cuda_source_dir() / name
        if not source.exists():
            raise BytesplatError(f"no {name} in {cuda_source_dir()}")
        found = measure_source(nvcc, cuobjdump, source, args.arch)
        rows += found
        for r in found:
            print(f"[sass] {name} {r['kernel']} {r['switches']}: loop {r['loop_instructions']}, "
                  f"{r.get('registers')} registers", flush=True)
    from bytesplat_ns.bench.train import environment

    result: Dict = {"benchmark": "bytesplat-bench sass", "arch": f"sm_{args.arch}", "nvcc": nvcc_version(nvcc),
                    "rows": rows, **environment(list(sys.argv[1:] if argv is None else argv), prog="bytesplat-bench sass")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
