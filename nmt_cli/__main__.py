"""`python -m nmt_cli` and the `nmt` script run the `nmt` command (also under torchrun).

Ctrl-C is one line and exit 130 from this module's first line on (both import it first): SIGINT is held from that
line, which imports nothing (_signal is the interpreter's own module, loaded before any code runs), until its handler
is set; one that came meanwhile quits then. Only the interpreter's own start-up comes before it, site's .pth files
(an editable install's finder) included.
"""

import _signal

held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})

from nmt_cli.errors import quit_on_ctrl_c  # noqa: E402 (SIGINT is held first)

quit_on_ctrl_c()
_signal.pthread_sigmask(_signal.SIG_SETMASK, held)


def main() -> None:
    from nmt_cli.cli import main as run

    run()


if __name__ == "__main__":
    main()
