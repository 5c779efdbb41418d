"""Time the DSA indexer's score kernels on the GPU machine: ``triton_sparse_mla.indexer.bench``
(what ``triton-sparse-mla bench --phase indexer`` runs), optionally one phase only.

Usage (GPU): python benchmarks/indexer_bench.py OUT.json [prefill|decode]
"""

import sys

from triton_sparse_mla.indexer import bench


def main(out_path, phase=None):
    work = [w for w in bench.workloads() if phase in (None, w.phase)]
    bench.run(work, json_path=out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
