"""Build the lab shim with g++ (no ninja): python benchmarks/host_shim/build.py OUT_DIR -> prints the .so path."""

import os
import subprocess
import sys
import sysconfig
import time
import torch
from torch.utils import cpp_extension as ce


def build(out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lng_shim.cpp")
    so = os.path.join(out_dir, "pcops_host_shim" + sysconfig.get_config_var("EXT_SUFFIX"))
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [
        "g++",
        "-O2",
        "-shared",
        "-fPIC",
        "-std=c++20",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-DTORCH_EXTENSION_NAME=pcops_host_shim",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *[f"-I{p}" for p in ce.include_paths()],
        f"-I{sysconfig.get_paths()['include']}",
        src,
        "-o",
        so,
        *[f"-L{p}" for p in ce.library_paths()],
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        "-ldl",
        *[f"-Wl,-rpath,{p}" for p in ce.library_paths()],
    ]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"built {so} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return so


if __name__ == "__main__":
    print(build(sys.argv[1]))
