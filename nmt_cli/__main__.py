"""`python -m nmt_cli` and the `nmt` script run the `nmt` command (also under torchrun).

Ctrl-C is one line and exit 130 from the first moment, the import of the command line included.
"""

from nmt_cli.errors import quit_on_ctrl_c


def main() -> None:
    quit_on_ctrl_c()
    from nmt_cli.cli import main as run

    run()


if __name__ == "__main__":
    main()
