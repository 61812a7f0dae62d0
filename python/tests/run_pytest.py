"""Runs the pytest suite (ctest's python_pytest) the way the numattn CLI runs itself: when the
OpenBLAS that numpy and numattn share fell back to its generic 'Prescott' kernels on this CPU,
re-execute with the OPENBLAS_CORETYPE that fits (numattn.blas_info()), since OpenBLAS reads it
only when it loads. An OPENBLAS_CORETYPE already in the environment is kept."""

import os
import subprocess
import sys

if "OPENBLAS_CORETYPE" not in os.environ:
    probe = subprocess.run(
        [sys.executable, "-c", "import numattn; print(numattn.blas_info()['recommended_coretype'] or '')"],
        capture_output=True, text=True, env=dict(os.environ, NUMATTN_KEEP_BLAS_CORE="1"))
    core = probe.stdout.strip()
    if probe.returncode == 0 and core:
        os.environ["OPENBLAS_CORETYPE"] = core
        print(f"run_pytest: OPENBLAS_CORETYPE={core} (OpenBLAS fell back to generic kernels)", flush=True)

sys.exit(subprocess.call([sys.executable, "-m", "pytest", *sys.argv[1:]]))
