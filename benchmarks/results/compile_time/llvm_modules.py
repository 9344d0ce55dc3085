"""LLVM time per kernel of one compile, from XLA's own log:

    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=ir_compiler=2 python one_compile.py 3 1 2> vlog.txt
    python llvm_modules.py vlog.txt

sums the "Compiled LLVM module: <kernel> time: ..." lines by kernel name (numbering dropped)."""
import collections
import re
import sys

total, by_name, count = 0.0, collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r"Compiled LLVM module: __compute_module_(\S+?)(?:_kernel_module)? time: ([\d.]+) (ms|us|s) ", line)
    if m:
        t = float(m.group(2)) * {"ms": 1e-3, "us": 1e-6, "s": 1.0}[m.group(3)]
        name = re.sub(r"\.\d+$", "", m.group(1))
        total += t
        by_name[name] += t
        count[name] += 1
print(f"{total:.2f} s of LLVM in {sum(count.values())} kernels")
for name, t in by_name.most_common(20):
    print(f"{t * 1e3:8.1f} ms {count[name]:4d} x {name}")
