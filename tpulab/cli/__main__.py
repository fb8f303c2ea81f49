"""`python -m tpulab.cli`, as before the CLI became a package."""

from tpulab.cli import main

main()
