"""``bytesplat-bench sass``: parsing cuobjdump's and ptxas' output, the compositing loop found around the
falloff's MUFU.EX2, its report table, and (where nvcc and cuobjdump exist) the real render kernels, whose
forward loop must be shorter with the falloff as 2^q than with expf."""

from __future__ import annotations

import pytest

from bytesplat_ns.bench import sass
from bytesplat_ns.bench.report import sass_table

# The shape of cuobjdump -sass output: an outer loop (0x0040 -> 0x00f0) around an inner one
# (0x0060 -> 0x00c0) that holds the EX2, then a second loop with its own EX2 (0x0100 -> 0x0130).
SASS = """
        code for sm_90
                Function : _ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                       /* 0x0000000000007919 */
        /*0020*/                   ISETP.GE.AND P0, PT, R0, 0x1, PT ;      /* 0x000000010000780c */
        /*0030*/              @!P0 BRA 0x140 ;                              /* 0x0000000000008947 */
        /*0040*/                   IADD3 R2, R2, 0x1, RZ ;                  /* 0x0000000102027810 */
        /*0050*/                   MOV R3, RZ ;                             /* 0x000000ff00037202 */
        /*0060*/                   LDS.128 R4, [R3] ;                       /* 0x0000000003047984 */
        /*0070*/                   FFMA R8, R4, R5, R6 ;                    /* 0x0000000504087223 */
        /*0080*/                   MUFU.EX2 R9, R8 ;                        /* 0x0000000800097308 */
        /*0090*/                   FMUL R10, R9, R7 ;                       /* 0x0000000709107220 */
        /*00a0*/                   VIADD R3, R3, 0x10 ;                     /* 0x0000001003037836 */
        /*00b0*/                   ISETP.NE.AND P1, PT, R3, R2, PT ;       /* 0x000000020300720c */
        /*00c0*/               @P1 BRA 0x60 ;                               /* 0xfffffffc00e41947 */
        /*00d0*/                   IADD3 R11, R11, 0x1, RZ ;                /* 0x000000010b0b7810 */
        /*00e0*/                   ISETP.NE.AND P2, PT, R11, R0, PT ;      /* 0x000000000b00720c */
        /*00f0*/               @P2 BRA 0x40 ;                               /* 0xfffffff000d02947 */
        /*0100*/                   MUFU.EX2 R12, R11 ;                      /* 0x0000000b000c7308 */
        /*0110*/                   FADD R12, R12, 1 ;                       /* 0x3f8000000c0c7421 */
        /*0120*/                   ISETP.NE.AND P3, PT, R12, RZ, PT ;      /* 0x000000ff0c00720c */
        /*0130*/               @P3 BRA 0x100 ;                              /* 0xfffffffc00f03947 */
        /*0140*/                   EXIT ;                                   /* 0x000000000000794d */
        /*0150*/                   BRA 0x150;                               /* 0xfffffffc00fc7947 */
                ..........
                Function : _ZN9bytesplat17render_fwd_kernelILb0EEEviii
        /*0000*/                   EXIT ;                                   /* 0x000000000000794d */
"""

PTXAS = """ptxas info    : Compiling entry function '_ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii' for 'sm_90'
ptxas info    : Function properties for _ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii
    16 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function '_ZN9bytesplat17render_fwd_kernelILb0EEEviii' for 'sm_90'
ptxas info    : Function properties for _ZN9bytesplat17render_fwd_kernelILb0EEEviii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 39 registers, used 1 barriers
"""


def test_the_innermost_loop_around_each_ex2_is_counted():
    kernels = sass.parse_sass(SASS)
    bwd = kernels["_ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii"]
    assert len(bwd) == 22 and bwd[8] == (0x80, "MUFU.EX2 R9, R8")
    # 0x60..0xc0 (7 instructions), not the outer 0x40..0xf0; then 0x100..0x130 (4); the self-branch at
    # 0x150 is a loop without an EX2
    assert sass.compositing_loops(bwd) == [7, 4]
    assert sass.compositing_loops(kernels["_ZN9bytesplat17render_fwd_kernelILb0EEEviii"]) == []
    assert sass.loop_local_accesses(bwd) == [0, 0]


def test_spills_inside_a_compositing_loop_are_counted_apart_from_those_outside():
    # a store before the loop, a load and a store inside it (the loop 0x20..0x60), a load after it
    text = """
                Function : _ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb0EEEvi
        /*0000*/                   STL [R1+0x4], R2 ;                       /* 0x0000000000007387 */
        /*0010*/                   MOV R3, RZ ;                             /* 0x0000000000007202 */
        /*0020*/                   LDL R4, [R1+0x4] ;                       /* 0x0000000000007983 */
        /*0030*/                   MUFU.EX2 R5, R4 ;                        /* 0x0000000000007308 */
        /*0040*/                   STL [R1+0x8], R5 ;                       /* 0x0000000000007387 */
        /*0050*/                   ISETP.NE.AND P0, PT, R5, RZ, PT ;       /* 0x000000000000720c */
        /*0060*/               @P0 BRA 0x20 ;                               /* 0xfffffffc00e40947 */
        /*0070*/                   LDL.LU R6, [R1+0x8] ;                    /* 0x0000000000007983 */
        /*0080*/                   EXIT ;                                   /* 0x000000000000794d */
"""
    (ins,) = sass.parse_sass(text).values()
    assert sass.compositing_loops(ins) == [5]
    assert sass.loop_local_accesses(ins) == [2]


def test_ptxas_resources_and_template_switches_are_read():
    res = sass.parse_resources(PTXAS)
    assert res["_ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii"] == {
        "registers": 48, "spill_stores": 12, "spill_loads": 20}
    assert res["_ZN9bytesplat17render_fwd_kernelILb0EEEviii"]["registers"] == 39
    assert sass.kernel_name("_ZN9bytesplat17render_bwd_kernelILb1ELb1ELb0ELb1EEEviii") == (
        "render_bwd_kernel", {"absgrad": True, "butterfly": True, "contribution": False, "fast_exp": True})
    assert sass.kernel_name("_ZN9bytesplat12_GLOBAL__N_117render_fwd_kernelILb0EEEviii") == (
        "render_fwd_kernel", {"fast_exp": False})
    assert sass.kernel_name("_ZN9bytesplat12_GLOBAL__N_112count_kernelEl") == ("count_kernel", {})


def _row(kernel, loops, **switches):
    return {"source": kernel.replace("_kernel", ".cu"), "kernel": kernel, "switches": switches, "instructions": 600, "registers": 40,
            "spill_stores": 0, "spill_loads": 0, "loop_instructions": loops, "loop_local_accesses": [0] * len(loops)}


def test_the_table_shows_what_the_falloff_as_2_to_the_q_saves():
    rows = [_row("render_fwd_kernel", [56], fast_exp=False), _row("render_fwd_kernel", [45], fast_exp=True),
            _row("render_bwd_kernel", [182], absgrad=True, butterfly=True, contribution=False, fast_exp=False),
            _row("render_bwd_kernel", [171], absgrad=True, butterfly=True, contribution=False, fast_exp=True),
            _row("render_bwd_kernel", [297], absgrad=True, butterfly=False, contribution=False, fast_exp=False)]
    lines = sass_table([{"result": {"benchmark": "bytesplat-bench sass", "arch": "sm_90", "nvcc": "13.0.88",
                                    "rows": rows}}])
    assert "sm_90, nvcc 13.0.88" in lines[0]
    assert "| render_fwd.cu | render_fwd_kernel | fast_exp | 40 | 0 / 0 | 0 | 600 | 45 | 11 |" in lines
    assert "| render_bwd.cu | render_bwd_kernel | absgrad, butterfly | 40 | 0 / 0 | 0 | 600 | 182 | - |" in lines
    assert "| render_bwd.cu | render_bwd_kernel | absgrad, butterfly, fast_exp | 40 | 0 / 0 | 0 | 600 | 171 | 11 |" in lines
    assert not any("297" in line for line in lines)  # the shuffle reduction's instances: JSON only


@pytest.mark.timeout(900)
def test_the_real_render_kernels_have_a_shorter_forward_loop_with_2_to_the_q():
    from bytesplat_ns.raster._build import _nvcc_path, cuda_source_dir

    nvcc = _nvcc_path()
    cuobjdump = sass.find_tool("cuobjdump", nvcc)
    if nvcc is None or cuobjdump is None:
        pytest.skip(f"needs nvcc and cuobjdump (nvcc {nvcc}, cuobjdump {cuobjdump})")
    rows = [row for name in ("render_fwd.cu", "render_bwd.cu")
            for row in sass.measure_source(nvcc, cuobjdump, cuda_source_dir() / name, "90")]
    # render_fwd: fast_exp; render_bwd: absgrad x butterfly x contribution x fast_exp; the 2px one: absgrad x fast_exp
    assert len(rows) == 2 + 16 + 4
    by = {(r["kernel"], tuple(sorted(r["switches"].items()))): r for r in rows}
    fwd = {f: by[("render_fwd_kernel", (("fast_exp", f),))] for f in (False, True)}
    assert all(len(r["loop_instructions"]) == 1 and r["registers"] > 0 for r in fwd.values())
    # the exponent and expf's range reduction against one ex2.approx: at least 8 instructions fewer
    assert fwd[True]["loop_instructions"][0] <= fwd[False]["loop_instructions"][0] - 8
    train = {f: by[("render_bwd_kernel", (("absgrad", True), ("butterfly", True), ("contribution", False),
                                          ("fast_exp", f)))] for f in (False, True)}
    assert train[True]["loop_instructions"][0] < train[False]["loop_instructions"][0]
    # the default training instances keep their compositing loops free of spills
    assert all(r["loop_local_accesses"] == [0] for r in (*fwd.values(), *train.values()))


def test_without_the_cuda_tools_it_is_one_clear_error(monkeypatch, tmp_path):
    from bytesplat_ns.errors import BytesplatError
    from bytesplat_ns.raster import _build

    monkeypatch.setattr(_build, "_nvcc_path", lambda: None)
    monkeypatch.setattr(sass, "find_tool", lambda name, nvcc: None)
    with pytest.raises(BytesplatError, match="needs nvcc and cuobjdump"):
        sass.main(["--out", str(tmp_path / "s.json")])
    assert not (tmp_path / "s.json").exists()
