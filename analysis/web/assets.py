"""The UI's files: analysis/static/ui/ and the uPlot and report script it shares with `report --html`,
read once into memory; a name not in the list is not served (no path is ever joined from a URL)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}
SHARED = ("uPlot.iife.min.js", "uPlot.min.css", "report.js")  # analysis/static/, as the HTML report's


@dataclass(frozen=True)
class Assets:
    files: dict[str, tuple[bytes, str]]

    @classmethod
    def load(cls) -> "Assets":
        static = resources.files("analysis") / "static"
        files: dict[str, tuple[bytes, str]] = {}
        for entry in (static / "ui").iterdir():
            suffix = "." + entry.name.rpartition(".")[2]
            if entry.is_file() and suffix in TYPES:
                files[entry.name] = (entry.read_bytes(), TYPES[suffix])
        for name in SHARED:
            files[name] = ((static / name).read_bytes(), TYPES["." + name.rpartition(".")[2]])
        return cls(files)

    def get(self, path: str) -> tuple[bytes, str] | None:
        return self.files.get(path)
