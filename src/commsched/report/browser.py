"""Render an HTML file in headless Chromium: a screenshot, or the DOM after its scripts ran and its console
messages (used by tests, benchmarks and the README's screenshot)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium-family browser on PATH, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _flags(profile: str) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]


_CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)$")


def load_page(html_path: str | Path, *, fragment: str = "", timeout_s: float = 120) -> tuple[str, list[str]]:
    """Load ``html_path`` (``#fragment`` appended when given) in headless Chromium and return the DOM after its
    scripts ran, and every console message the page produced (``console.log`` / ``error`` and uncaught
    exceptions, each as ``"text", source: URL (line)``). Raises as :func:`screenshot` does."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found on PATH; install it (Debian: apt-get install -y chromium)")
    url = Path(html_path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory(prefix="commsched-chromium-") as profile:
        cmd = [browser, *_flags(profile), "--enable-logging=stderr", "--v=0", "--dump-dom", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not proc.stdout.strip():
        tail = proc.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} returned no DOM (exit {proc.returncode}): {' | '.join(tail)}")
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return proc.stdout, console


def screenshot(
    html_path: str | Path, png_path: str | Path, *, width: int = 1280, height: int = 2000, timeout_s: float = 120
) -> Path:
    """Load ``html_path`` in headless Chromium and save a ``width`` x ``height`` screenshot to ``png_path``.

    Raises FileNotFoundError when no browser is installed (Debian: ``apt-get install -y chromium``) and
    RuntimeError when the browser fails or writes no picture.
    """
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found on PATH; install it (Debian: apt-get install -y chromium)")
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    png_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="commsched-chromium-") as profile:
        cmd = [
            browser,
            *_flags(profile),
            f"--screenshot={png_path}",
            f"--window-size={width},{height}",
            html_path.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not png_path.exists() or png_path.stat().st_size == 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} wrote no screenshot (exit {proc.returncode}): {' | '.join(tail)}")
    return png_path
