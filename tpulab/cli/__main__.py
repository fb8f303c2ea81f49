"""`python -m tpulab.cli`, as before the CLI became a package."""

from tpulab.cli import main

# Guarded so that importing every module (the envelope schema test walks the package)
# does not start the CLI.
if __name__ == "__main__":
    main()
