"""`python -m nmt_cli` runs the `nmt` command (also under torchrun)."""

from nmt_cli.cli import main

if __name__ == "__main__":
    main()
