"""``bench.common.cpu_info``: the CPU a benchmark ran on, recorded with its figures."""

from __future__ import annotations

from bench.common import cpu_info

INTEL = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni amx_int8 avx_vnni

processor\t: 1
model name\t: another name the first core's wins over
flags\t\t: fpu
"""

AMD = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma sha_ni
"""


def test_the_model_and_the_kernels_flags_of_the_first_core() -> None:
    assert cpu_info(INTEL) == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8488C",
        "cpu_flags": ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"],
    }


def test_a_cpu_without_avx512_lists_avx2_alone() -> None:
    assert cpu_info(AMD) == {"cpu_model": "AMD EPYC", "cpu_flags": ["avx2"]}


def test_this_machine_is_described() -> None:
    info = cpu_info()
    assert set(info) == {"cpu_model", "cpu_flags"}
