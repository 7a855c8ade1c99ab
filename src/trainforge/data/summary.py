"""What a user should see about the data on the console, computed from data_report.json's content.

    s = summarize(bundle.report)
    console.print(s.line)                     # data: 1,202 rows read, 1,071 kept, dropped 131 (...); splits ...
    for w in s.warnings: console.print(w)     # in yellow
    for n in s.notes: console.print(n)        # e.g. data: manifest reused: 20,000 files unchanged (...)
    json_result["data"] = s.counts            # --json: the same numbers

A pure function of the report dict (`trainforge.data.pipeline.data_report`), so it also works on a
data_report.json read back from a run directory. Warnings are raised when more than
DROP_WARN_FRACTION of the rows were dropped, when a class has fewer than MIN_CLASS_SAMPLES samples,
and when labels seen once became classes of their own because `data.args.classes` was not declared.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trainforge.errors import quote

DROP_WARN_FRACTION = 0.05  # warn when more than this share of the rows read was dropped
MIN_CLASS_SAMPLES = 5  # warn about classes with fewer samples than this (all splits together)
MAX_NAMED = 5  # classes or labels named in one warning; the rest are counted
MAX_NAME_CHARS = 40  # a label value named in a warning is cut to about this many characters


@dataclass(frozen=True)
class DataSummary:
    line: str  # one line: rows read, kept, dropped by reason, split sizes
    warnings: tuple[str, ...]  # one line each, to print highlighted; empty for clean data
    counts: dict[str, Any]  # JSON-able: rows_read, rows_kept, dropped {reason: n}, dropped_total, splits, warnings
    notes: tuple[str, ...] = ()  # further plain lines: what the folder's manifest saved or found


def summarize(report: Mapping[str, Any]) -> DataSummary:
    """The console line, the warnings and the --json counts for one data report."""
    read = int(report.get("rows_read", 0))
    kept = int(report.get("rows_kept", 0))
    # detection data: these reasons count boxes (and a point cloud's points), not images or frames
    per_box = set(report.get("box_reasons") or ()) | set(report.get("point_reasons") or ())
    dropped = {reason: int(n) for reason, n in report.get("dropped", {}).items() if reason not in per_box}
    box_drops = {reason: int(n) for reason, n in report.get("dropped", {}).items() if reason in per_box}
    total = sum(dropped.values())
    splits = {name: int(n) for name, n in report.get("splits", {}).items()}
    warnings = tuple(w for w in (_drop_warning(report, read, dropped), *_class_warnings(report)) if w)
    counts = {
        "rows_read": read,
        "rows_kept": kept,
        "dropped": dropped,
        "dropped_total": total,
        "splits": splits,
        "warnings": list(warnings),
    }
    chat = report.get("chat")
    if isinstance(chat, Mapping) and "loss_token_share" in chat:  # chat data: what share of its tokens is learned
        counts["loss_token_share"] = float(chat["loss_token_share"])
    manifest = report.get("manifest")
    notes = (manifest_line(manifest),) if isinstance(manifest, Mapping) else ()
    if notes:
        counts["manifest"] = {k: manifest.get(k) for k in ("status", "files", "new", "changed", "removed", "read")}
    line = _line(read, kept, dropped, splits) + _chat(chat)
    if per_box:
        counts["dropped_boxes"] = box_drops
        line = _boxes_line(line, report, box_drops)
    return DataSummary(line=line, warnings=warnings, counts=counts, notes=notes)


def _boxes_line(line: str, report: Mapping[str, Any], box_drops: Mapping[str, int]) -> str:
    """Detection data: the rows are images; what cleaning did to their boxes follows them."""
    rows = str(report.get("rows_are") or "images")  # what a row is: an image, or a point cloud's frame
    line = line.replace(" rows read,", f" {rows} read,", 1)
    boxes = report.get("boxes") or {}
    clipped = box_drops.get("out_of_bounds", 0)
    point_reasons = set(report.get("point_reasons") or ())
    gone = {k: n for k, n in box_drops.items() if k != "out_of_bounds" and k not in point_reasons}
    text = f"; boxes {int(boxes.get('read', 0)):,} read, {int(boxes.get('kept', 0)):,} kept"
    if clipped:
        text += f", {clipped:,} clipped to their image (out_of_bounds)"
    if sum(gone.values()):
        text += f", dropped {sum(gone.values()):,} ({_reasons(gone)})"
    points = {k: n for k, n in box_drops.items() if k in point_reasons}
    if sum(points.values()):
        text += f"; points dropped {sum(points.values()):,} ({_reasons(points)})"
    negatives = int(report.get("negatives", 0))
    if negatives:
        text += f"; {negatives:,} images without boxes kept as negatives"
    head, sep, splits = line.partition("; splits ")
    return head + text + sep + splits


def manifest_line(m: Mapping[str, Any]) -> str:
    """What this process's look at an image folder's manifest did: reused it, or read which files."""
    files, status = int(m.get("files", 0)), m.get("status")
    changes = f"{int(m.get('new', 0)):,} new, {int(m.get('changed', 0)):,} changed, {int(m.get('removed', 0)):,} removed"
    if status == "reused":
        return f"data: manifest reused: {files:,} files, none read ({m.get('path')})"
    if status == "uncached":
        return f"data: no manifest (its folder is not writable): all {files:,} files read"
    why = f" ({m['rebuilt_because']})" if status == "rebuilt" and m.get("rebuilt_because") else ""
    return (f"data: manifest {status}{why}: {files:,} files, {changes}; read {int(m.get('read', 0)):,} "
            f"({m.get('path')})")


def runtime_line(found: Mapping[str, Any]) -> str:
    """The end-of-run line about files that failed to decode while training ("" when none did)."""
    n = int(found.get("decode_failed", 0))
    if not n:
        return ""
    examples = ", ".join(_name(e) for e in found.get("examples", []))
    return (f"data: {n:,} file(s) failed to decode during the run and were replaced by other samples of their split "
            f"(e.g. {examples}); the next run drops them before splitting (data_report.json: dropped_at_run_time)")


def _reasons(dropped: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in dropped.items() if n)


def _line(read: int, kept: int, dropped: Mapping[str, int], splits: Mapping[str, int]) -> str:
    total = sum(dropped.values())
    line = f"data: {read:,} rows read, {kept:,} kept, dropped {total:,}"
    if total:
        line += f" ({_reasons(dropped)})"
    if splits:
        line += "; splits " + " / ".join(f"{name} {n:,}" for name, n in splits.items())
    return line


def _chat(chat: Any) -> str:
    """`data.source: chat`: the windows the splits count, and the share of the tokens that carries loss."""
    if not isinstance(chat, Mapping) or "loss_token_share" not in chat:
        return ""
    packed = " (packed)" if chat.get("pack") else ""
    return (f" windows of {int(chat.get('seq_len', 0)):,} tokens{packed}; loss on "
            f"{100 * float(chat['loss_token_share']):.1f}% of {int(chat.get('tokens', 0)):,} tokens "
            f"(train_on {chat.get('train_on')})")


def _name(value: Any) -> str:
    return quote(str(value), MAX_NAME_CHARS)


def _named(items: list[str]) -> str:
    """The first MAX_NAMED items joined, and how many more there are."""
    text = ", ".join(items[:MAX_NAMED])
    return text + (f" and {len(items) - MAX_NAMED:,} more" if len(items) > MAX_NAMED else "")


def _drop_warning(report: Mapping[str, Any], read: int, dropped: Mapping[str, int]) -> str:
    total = sum(dropped.values())
    if read <= 0 or total / read <= DROP_WARN_FRACTION:
        return ""
    text = f"data: {100 * total / read:.1f}% of the {read:,} rows read were dropped ({_reasons(dropped)})"
    unknown = report.get("labels_not_in_classes") or {}
    if unknown:
        labels = [f"{_name(label)} ({n:,} rows)" for label, n in unknown.items()]
        text += f"; labels not in data.args.classes: {_named(labels)}: add them to data.args.classes to keep them"
    return text + "; examples of each reason are in data_report.json (dropped_examples)"


def _class_warnings(report: Mapping[str, Any]) -> list[str]:
    per_split = report.get("class_counts") or {}
    totals: dict[str, int] = {}
    for counts in per_split.values():
        for name, n in counts.items():
            totals[name] = totals.get(name, 0) + int(n)
    seen_once = list(report.get("classes_seen_once") or [])
    out = []
    once = set(seen_once)
    small = [(name, n) for name, n in totals.items() if n < MIN_CLASS_SAMPLES and name not in once]
    if small:
        names = [f"{_name(name)} ({n})" for name, n in sorted(small, key=lambda item: item[1])]
        out.append(
            f"data: {len(small):,} class(es) with fewer than {MIN_CLASS_SAMPLES} samples: {_named(names)}; "
            "their metrics are unreliable: add samples or merge classes"
        )
    if seen_once:
        out.append(
            f"data: {len(seen_once):,} label(s) appear only once and each became a class of its own "
            f"({_named([_name(n) for n in seen_once])}) because data.args.classes is not set; list the valid "
            "labels in data.args.classes to drop the others as bad_label"
        )
    return out
