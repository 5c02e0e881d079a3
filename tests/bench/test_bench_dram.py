"""Summing Nsight Compute's CSV into device-memory bytes per stage (bytesplat_ns.bench.dram)."""

from bytesplat_ns.bench.dram import parse_ncu_csv

CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","h","fused_loss_kernel","1","7","(256, 1, 1)","(8160, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,000,000"
"0","123","python","h","fused_loss_kernel","1","7","(256, 1, 1)","(8160, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","250"
"1","123","python","h","elementwise","1","7","(128, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","4096"
"1","123","python","h","elementwise","1","7","(128, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","8"
==PROF== Disconnected from process 123
'''


def test_parse_sums_every_kernel_in_base_units():
    got = parse_ncu_csv(CSV)
    assert got == {"kernels": 2, "dram_read_bytes": 1_004_096.0, "dram_write_bytes": 258.0, "dram_bytes": 1_004_354.0}
