"""``simspec dashboard``: start the Streamlit what-if dashboard on localhost.

Imports: the standard library and simspec.pool (die_with_parent).
The app ships as the package ``simspec_dashboard`` (the repository's
``dashboard/`` folder); this module finds its entry script and runs
``streamlit run`` on it headless: no browser is opened and no usage
statistics are sent. The app itself uses simspec's public API only.
Stopping the launcher (Ctrl-C, SIGTERM, SIGHUP) stops the server; should
the launcher be killed outright, the kernel ends the server with it.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

from simspec.pool import die_with_parent
from simspec.types import InputError

DEFAULT_PORT = 8501  # Streamlit's own default
ADDRESS = "localhost"  # never listen beyond this machine


def parse_port(text: str) -> int:
    """``--port``: an integer in 1..65535 that is free on localhost."""
    try:
        port = int(text)
    except ValueError:
        raise InputError(f"--port must be an integer in 1..65535 (got {text!r})") from None
    if not 1 <= port <= 65535:
        raise InputError(f"--port must be an integer in 1..65535 (got {port})")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ADDRESS, port))
        except OSError as err:
            raise InputError(f"--port {port}: cannot listen on {ADDRESS}:{port} ({err.strerror or err}); "
                             "choose another port") from None
    return port


def app_path() -> Path:
    """The app's entry script, from the ``simspec_dashboard`` package's path
    (a plain or an editable install, also one made while the package was
    still a bare folder, which Python then imports as a namespace package)."""
    spec = find_spec("simspec_dashboard")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        app = Path(folder) / "app.py"
        if app.is_file():
            return app
    raise InputError("the dashboard is not installed (no simspec_dashboard/app.py); reinstall: pip install -e .")


def command(port: int) -> list[str]:
    """The ``streamlit run`` command line that serves the app on ``port``."""
    app = app_path()
    return [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.headless", "true", "--server.address", ADDRESS, "--server.port", str(port),
            "--browser.gatherUsageStats", "false"]


def cmd_dashboard(args: argparse.Namespace) -> int:
    port = parse_port(args.port)
    print(f"simspec dashboard: http://{ADDRESS}:{port} (Ctrl-C stops it)", flush=True)
    server = subprocess.Popen(command(port), preexec_fn=die_with_parent)
    try:
        return server.wait()
    finally:  # SIGINT, SIGTERM and SIGHUP reach here (simspec.cli): the server goes with the launcher
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def add(sub: argparse._SubParsersAction) -> None:
    """Register the ``dashboard`` subcommand."""
    p = sub.add_parser("dashboard", help="the what-if dashboard in your browser (Streamlit, on localhost)")
    p.add_argument("--port", default=str(DEFAULT_PORT), metavar="P",
                   help=f"port on localhost to serve it on (default: {DEFAULT_PORT})")
    p.set_defaults(handler=cmd_dashboard)
