"""What a preprocessing run may reuse of what earlier runs left in its ``--out``, and why not: every rule in one
place.

A run into a folder that runs wrote to before (a rerun, a resumed run, another ``--part``, a frames run then a
flow run, the same command twice at once) finds three kinds of things there:

- **Archives**, ``<out>/<stream>/<id>.tar``, each there under its final name only once complete. One is reused —
  the video's stream is skipped, its bytes untouched — when it was made with the settings this run would write
  from the same source file. The settings compared are those that change its frames (:func:`setting_options`:
  frame size, fps, encoding, the flow's third channel and TV-L1 parameters), read from its ``meta.json`` alone.
  Not compared: how the flow was computed (flow backend, device, workers, threads: every backend computes the
  same TV-L1, to within float rounding), whether a truncated video's frames were kept (``--keep-partial``),
  settings an archive of an older version does not record (nor its frames' sizes: shard then reads its
  headers), and the source of an archive whose source file is gone since (the archive is all that is left of
  it). The source is compared by its path, then by its size, modification time and SHA-256 where they are
  recorded (:mod:`memdpc.preprocess.source`: a file touched but not changed is the same); a file at another path
  with the recorded size and SHA-256 is the same source, moved or copied with its folder. An archive made
  otherwise is not reused: the run refuses to start, naming how many, one of them and what differs, unless
  ``--overwrite``, which writes it again; one whose ``meta.json`` does not read counts as made otherwise, the
  reason as its difference. :func:`remake_command` is the command that writes an archive again as it was made.
- **Report lines** (:mod:`memdpc.preprocess.report`: reports are appended to, never rewritten). A video whose
  archives are all reused gets no line: the line of the run that wrote them still describes them. A video
  converted gets one naming the streams it wrote; a video that failed, one naming the streams whose archive is
  not there (``tried``), so that it does not take over the description of an archive an earlier run wrote.
- **Temporary archives** (``.tmp-<pid>-<id>.tar``, locked by their writer while it lives) are never reused: a
  video to do starts its archives over. Those of this run's videos that no live writer holds, which killed
  runs left, are removed as the run starts and when it stops; those a live run holds (the same command twice on
  one folder) and those of other videos (another ``--part``'s) are left alone.

A run asks once per video, before any work (:meth:`Rerun.check`); a job asks again as it starts a video
(:func:`missing_streams`), since another run on the folder, or the video's first try by a worker that died,
may have written an archive since.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memdpc.common.atomic import TMP_PREFIX
from memdpc.common.errors import UserError
from memdpc.common.streams import STREAMS
from memdpc.common.wording import plural
from memdpc.preprocess.archive import archive_path, read_meta, temporary_in_use
from memdpc.preprocess.encode import FLOW_ENCODINGS, RGB_ENCODING
from memdpc.preprocess.flow.backends import BOUND
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.source import same_bytes, source_changes
from memdpc.preprocess.video_index import VideoRecord

__all__ = [
    "DECODE_SETTINGS",
    "Rerun",
    "Verdict",
    "archive_differences",
    "archive_settings",
    "missing_streams",
    "remake_command",
    "remove_temporaries",
    "setting_options",
    "verdict",
]

CHECK_THREADS = 8  # threads reading the meta.json of existing archives (their latency, on network storage)
CHECK_CHUNK = 512  # videos per task of those threads


# ------------------------------------------------------------------------------- the settings compared
def archive_settings(stream: str, cfg: PreprocessConfig) -> dict[str, Any]:
    """The part of a ``stream`` archive's ``meta.json`` that ``cfg`` decides (``cfg.flow_backend`` is the
    backend used): what the archive records of how it was made."""
    settings: dict[str, Any] = {"stream": stream, "decode": asdict(cfg.decode)}
    if stream == "rgb":
        settings["encoding"] = cfg.rgb_encoding.name
    else:
        settings["encoding"] = cfg.flow_encoding.name
        settings["flow"] = {
            "backend": cfg.flow_backend,
            "pairs": "frame k -> k+1",
            "channels": ["x", "y", "third"],  # R, G, B of the decoded image
            "bound": BOUND,
            "mapping": f"round((clip(f, -{BOUND:g}, {BOUND:g}) + {BOUND:g}) * 255 / {2 * BOUND:g})",
            "third_channel": cfg.third_channel,
            "tvl1": cfg.tvl1.to_dict(),
        }
    return settings


DECODE_SETTINGS = ("frame size", "fps")  # the settings of setting_options that a video's two streams share


def setting_options(settings: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The compared settings in ``settings`` (a ``meta.json`` or :func:`archive_settings`): name → (value,
    the options that give it, as the user types them). Shard reads archives' settings through it too."""
    out: dict[str, tuple[Any, str]] = {}
    decode = settings.get("decode")
    if isinstance(decode, dict):
        square, size, fps = decode.get("square", 0), decode.get("size", 0), decode.get("fps", 0.0)
        out["frame size"] = (
            (("square", square), f"--square {square}") if square else (("size", size), f"--size {size}")
        )
        out["fps"] = (fps, f"--fps {fps:g}")
    if "encoding" in settings:
        out["encoding"] = (
            settings["encoding"],
            _encoding_options(settings.get("stream"), settings["encoding"]),
        )
    flow = settings.get("flow")
    if isinstance(flow, dict):
        if "third_channel" in flow:
            out["third channel"] = (flow["third_channel"], f"--third-channel {flow['third_channel']}")
        for name, value in (flow.get("tvl1") or {}).items():
            option = "--" + name.rstrip("_").replace("_", "-")  # TVL1Params field → CLI option
            out[f"tvl1 {name}"] = (
                value,
                f"{option} {value:g}" if isinstance(value, (int, float)) else option,
            )
    return out


def _encoding_options(stream: str | None, name: str) -> str:
    """``jpeg-q90-420`` → ``--quality 90`` (rgb); ``jpeg-q100-planes`` → ``--flow-encoding planes --flow-quality
    100`` (flow); the name itself where no option gives it."""
    m = re.fullmatch(r"jpeg-q(\d+)-(\w+)", str(name))
    if m and stream == "rgb" and m[2] == RGB_ENCODING.sampling:
        return f"--quality {m[1]}"
    flow = {enc.sampling: key for key, enc in FLOW_ENCODINGS.items()}
    if m and stream == "flow" and m[2] in flow:
        return f"--flow-encoding {flow[m[2]]} --flow-quality {m[1]}"
    return str(name)


@functools.lru_cache(maxsize=8)
def _expected_options(stream: str, cfg: PreprocessConfig) -> dict[str, tuple[Any, str]]:
    return setting_options(archive_settings(stream, cfg))  # once per run, not per archive


# ------------------------------------------------------------------------------------------- archives
def _source_differences(meta: dict[str, Any], rec: VideoRecord) -> list[str]:
    """How ``rec``'s file differs from the source recorded in ``meta`` (:func:`~memdpc.preprocess.source.source_changes`:
    a source that is gone since is not compared, its archive is all that is left of it)."""
    recorded = meta.get("source")
    if recorded is not None and recorded != rec.path:
        return [] if same_bytes(meta, rec.path) else [f"source {recorded} → {rec.path}"]
    changes = source_changes(meta, rec.path)
    return [f"{rec.path} changed since ({', '.join(changes)})"] if changes else []


def archive_differences(rec: VideoRecord, stream: str, cfg: PreprocessConfig) -> list[str]:
    """How ``rec``'s existing ``stream`` archive differs from what ``cfg`` would write: one text per
    difference, e.g. ``--size 64 → --square 64`` or ``source /a/v.avi → /b/v.avi``; empty when it matches.
    Reads only the archive's ``meta.json`` (:func:`memdpc.preprocess.archive.read_meta`)."""
    try:
        meta = read_meta(archive_path(cfg.out, stream, rec.id))
    except UserError as e:
        return [str(e).split(": ", 1)[-1]]
    expected, found = _expected_options(stream, cfg), setting_options(meta)
    diffs = [f"{found[k][1]} → {v[1]}" for k, v in expected.items() if k in found and found[k][0] != v[0]]
    return diffs + _source_differences(meta, rec)


@dataclass(frozen=True)
class Verdict:
    """What a run may reuse of one video's archives: ``missing``, the run's streams without one; ``other``, per
    stream whose archive was made otherwise, how it differs. The rest are reused."""

    rec: VideoRecord
    missing: tuple[str, ...]
    other: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def done(self) -> bool:
        """Every archive of the run is there and reused: nothing to do for the video."""
        return not self.missing and not self.other


def verdict(rec: VideoRecord, cfg: PreprocessConfig) -> Verdict:
    """What ``cfg``'s run may reuse of ``rec``'s archives in ``cfg.out``."""
    missing, other = [], []
    for s in cfg.streams:
        if not archive_path(cfg.out, s, rec.id).exists():
            missing.append(s)
        elif diffs := archive_differences(rec, s, cfg):
            other.append((s, tuple(diffs)))
    return Verdict(rec, tuple(missing), tuple(other))


def missing_streams(rec: VideoRecord, cfg: PreprocessConfig) -> list[str]:
    """The streams of ``rec`` to write, as a job asks as it starts the video: those without an archive, and with
    ``cfg.overwrite`` those whose archive was made with other settings or from another source (a run refuses
    those before, without it: :meth:`Rerun.check`)."""
    return [
        s
        for s in cfg.streams
        if not archive_path(cfg.out, s, rec.id).exists()
        or (cfg.overwrite and archive_differences(rec, s, cfg))
    ]


def remake_command(index: str, root: str | os.PathLike, video_id: str) -> str:
    """The ``memdpc preprocess`` command that writes a video's archives in ``root`` again as they were made (the
    streams it has there, each setting that is not the default) over the ones there (``--overwrite``)."""
    streams = [s for s in STREAMS if archive_path(root, s, video_id).is_file()]
    options: dict[str, str] = {}
    for s in streams:
        try:
            found = setting_options(read_meta(archive_path(root, s, video_id)))
        except UserError:
            continue
        default = _expected_options(s, PreprocessConfig(out=str(root), streams=(s,)))
        options |= {k: v[1] for k, v in found.items() if k in default and v[0] != default[k][0]}
    verb = "flow" if "flow" in streams else "frames"
    return " ".join(
        ["memdpc preprocess", verb, index, "--out", str(root), "--streams", ",".join(streams) or "rgb"]
        + list(dict.fromkeys(options.values()))
        + ["--overwrite"]
    )


# -------------------------------------------------------------------------------- temporary archives
def remove_temporaries(out: str | os.PathLike, streams: Iterable[str], ids: Collection[str]) -> int:
    """Delete the temporary archives of the videos ``ids`` (left by a killed or stopped run; only these
    videos', as parts may share ``out`` and run at the same time, and none that a live writer holds: the same
    command may run twice on one folder); one listing per stream. Returns how many."""
    pattern, removed = re.compile(rf"{re.escape(TMP_PREFIX)}\d+-(.+)\.tar"), 0
    for s in streams:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(Path(out) / s):
                m = pattern.fullmatch(entry.name)
                if m and m[1] in ids and not temporary_in_use(entry.path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
    return removed


# ------------------------------------------------------------------------------------------------ a run
@dataclass(frozen=True)
class Rerun:
    """What a run (``cfg``) reuses of its ``--out``, each of this part's videos asked once (:meth:`check`):
    ``done``, the videos whose archives are all reused; ``todo``, those with an archive to write."""

    cfg: PreprocessConfig
    done: list[VideoRecord]
    todo: list[VideoRecord]

    @classmethod
    def check(cls, mine: list[VideoRecord], cfg: PreprocessConfig) -> Rerun:
        """The :func:`verdict` of each video of ``mine``, from several threads (each reads only ``meta.json``s).
        Archives made otherwise are refused with their count, an example and what differs (UserError), unless
        ``cfg.overwrite``: their videos are then to do. Touches nothing."""
        chunks = [mine[i : i + CHECK_CHUNK] for i in range(0, len(mine), CHECK_CHUNK)]
        ex = ThreadPoolExecutor(CHECK_THREADS)
        try:
            verdicts = [
                v for part in ex.map(lambda recs: [verdict(r, cfg) for r in recs], chunks) for v in part
            ]
        finally:
            ex.shutdown(cancel_futures=True)  # an interrupt does not wait for the rest of the check
        other = [(v.rec, s, diffs) for v in verdicts for s, diffs in v.other]
        if other and not cfg.overwrite:
            rec, stream, diffs = other[0]
            n = len(other)
            raise UserError(
                f"{plural(n, 'archive')} in {cfg.out} {'were' if n > 1 else 'was'} made with other settings or "
                f"from another source, e.g. {archive_path(cfg.out, stream, rec.id)} ({'; '.join(diffs)}); "
                "rerun with --overwrite to rewrite them, or choose another --out"
            )
        return cls(cfg, [v.rec for v in verdicts if v.done], [v.rec for v in verdicts if not v.done])

    def clear_temporaries(self, finished: Collection[str] = ()) -> int:
        """Remove the temporary archives of the videos to do but ``finished`` that no live writer holds: as the
        run starts, those killed runs left; as it stops, its own of the videos it did not finish."""
        ids = {r.id for r in self.todo if r.id not in finished}
        return remove_temporaries(self.cfg.out, self.cfg.streams, ids)

    def gets_line(self, entry: dict[str, Any]) -> bool:
        """Whether a video's entry goes to the report: not when the video was skipped (its archives reused, found
        there as a job started it), whose archives the line of the run that wrote them describes."""
        return entry["status"] != "skipped"

    def tried(self, entry: dict[str, Any]) -> list[str]:
        """The streams a failed video's report line names as not written: those whose archive is not there (an
        earlier run's archive of another stream stays described by that run's line); none for another entry."""
        if entry["status"] != "failed":
            return []
        return [s for s in self.cfg.streams if not archive_path(self.cfg.out, s, entry["id"]).exists()]
