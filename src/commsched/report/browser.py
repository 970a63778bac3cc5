"""Render an HTML file in headless Chromium and take a screenshot (used by tests and benchmarks)."""

from __future__ import annotations

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
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={png_path}",
            f"--window-size={width},{height}",
            html_path.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not png_path.exists() or png_path.stat().st_size == 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} wrote no screenshot (exit {proc.returncode}): {' | '.join(tail)}")
    return png_path
