"""Turn the harness's tallies into REPORT.md and report.json: totals per path, then one row per op."""
from __future__ import annotations

import collections
import json
import os

import torch

from . import skips
from .harness import dtype_name, full_name


def _empty():
    return {"passed": 0, "failed": 0, "fallback": 0, "skipped": 0}


def _clean(ok: dict) -> bool:
    """Every sample run passed on the device itself (skips allowed, at least one pass)."""
    return ok["failed"] == 0 and ok["fallback"] == 0 and ok["passed"] > 0


def build(rows: list[dict], meta: dict, op_db, indices: list[int]) -> dict:
    paths = [p for p in meta["paths"] if p not in meta.get("unavailable_paths", {})]
    order = [full_name(op_db[i]) for i in indices]
    float32_ops = {full_name(op_db[i]) for i in indices
                   if op_db[i].supports_dtype(torch.float32, "cpu")}
    by_key: dict = collections.OrderedDict()
    for r in rows:
        key = (r["op"], r["variant"])
        entry = by_key.setdefault(key, {"op": r["op"], "variant": r["variant"], "dtypes": [],
                                        "paths": {}})
        if r["dtype"] != "-" and r["dtype"] not in entry["dtypes"]:
            entry["dtypes"].append(r["dtype"])
        p = entry["paths"].setdefault(r["path"], {**_empty(), "first_error": "", "skip_reason": "",
                                                  "fallback_ops": {}, "seconds": 0.0,
                                                  "by_dtype": {}})
        for k in ("passed", "failed", "fallback", "skipped"):
            p[k] += r[k]
        p["seconds"] = round(p["seconds"] + r["seconds"], 3)
        p["first_error"] = p["first_error"] or (f"[{r['dtype']}] {r['first_error']}"
                                                if r["first_error"] else "")
        p["skip_reason"] = p["skip_reason"] or r["skip_reason"]
        for k, v in r["fallback_ops"].items():
            p["fallback_ops"][k] = p["fallback_ops"].get(k, 0) + v
        p["by_dtype"][r["dtype"]] = [r["passed"], r["failed"], r["fallback"], r["skipped"]]
    rank = {name: i for i, name in enumerate(order)}
    ops = sorted(by_key.values(), key=lambda e: (rank.get(e["op"], 1 << 30), e["variant"]))

    totals = {}
    for path in paths:
        t = {**_empty(), "opinfos": 0, "opinfos_all_pass": 0, "opinfos_skipped": 0,
             "float32_opinfos": 0, "float32_all_pass": 0, "inplace_variants": 0,
             "inplace_all_pass": 0, "partial_views_pass": None, "fallback_samples": 0,
             "fallback_ops": {}, "seconds": 0.0, "ops_with_fallback": 0}
        for e in ops:
            p = e["paths"].get(path)
            if p is None:
                continue
            for k in ("passed", "failed", "fallback", "skipped"):
                t[k] += p[k]
            t["seconds"] += p["seconds"]
            for k, v in p["fallback_ops"].items():
                t["fallback_ops"][k] = t["fallback_ops"].get(k, 0) + v
            t["ops_with_fallback"] += bool(p["fallback_ops"])
            if e["variant"] == "inplace":
                t["inplace_variants"] += 1
                t["inplace_all_pass"] += _clean(p)
                continue
            if e["op"] in skips.SKIP_OPS:
                t["opinfos_skipped"] += 1
                continue
            t["opinfos"] += 1
            t["opinfos_all_pass"] += _clean(p)
            if e["op"] in float32_ops:
                t["float32_opinfos"] += 1
                f32 = p["by_dtype"].get("float32")
                if f32 and f32[1] == 0 and f32[2] == 0 and f32[0] > 0:
                    t["float32_all_pass"] += 1
            if e["op"].endswith(".partial_views"):
                t["partial_views_pass"] = _clean(p)
        t["fallback_samples"] = t["fallback"]
        t["seconds"] = round(t["seconds"], 1)
        t["fallback_ops"] = dict(sorted(t["fallback_ops"].items(), key=lambda kv: -kv[1]))
        totals[path] = t
    return {"meta": meta, "totals": totals, "comparison": comparison_rules(), "ops": ops}


def comparison_rules() -> dict:
    return {
        "default_tolerances": {dtype_name(k): {"rtol": v[0], "atol": v[1]}
                               for k, v in skips.DEFAULT_TOLERANCES.items()},
        "integer_and_bool": "exact",
        "op_overrides": "the op's own toleranceOverride/precisionOverride decorators in op_db "
                        "(CPU or any device type) loosen the default for that dtype",
        "extra_overrides": {k: {"tolerances": {dtype_name(d): t for d, t in v[0].items()},
                                "reason": v[1]} for k, v in skips.TOLERANCES.items()},
        "random_ops": sorted(skips.RANDOM_OPS),
        "random_rule": "shape and dtype exact; no non-finite values where eager has none; with "
                       ">= 100 elements, means within 0.2 std + 4 std*sqrt(2/n) and std ratio in "
                       "[0.6, 1.67], or the 10/50/90% quantiles within 0.25 of eager's 10-90% "
                       "spread",
        "metadata_only": sorted(skips.METADATA_ONLY),
        "sign_aligned": {k: v[0] for k, v in skips.SIGN_ALIGNED.items()},
        "tie_aligned": {k: v[0] for k, v in skips.TIE_ALIGNED.items()},
        "skipped_ops": skips.SKIP_OPS,
    }


def _cell(p) -> str:
    if p is None:
        return "-"
    return f"{p['passed']}/{p['failed']}/{p['fallback']}/{p['skipped']}"


def _md(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def summary(data: dict) -> str:
    m = data["meta"]
    lines = [f"wall {m['wall_seconds']:.0f}s, {m['ops_selected']} OpInfos, cap {m['cap']}"]
    for path, why in m.get("unavailable_paths", {}).items():
        lines.append(f"  {path}: NOT RUN ({why})")
    for path, t in data["totals"].items():
        lines.append(
            f"  {path}: OpInfos all-pass {t['opinfos_all_pass']}/{t['opinfos']}, float32 "
            f"{t['float32_all_pass']}/{t['float32_opinfos']}, in-place {t['inplace_all_pass']}/"
            f"{t['inplace_variants']}; samples passed {t['passed']} failed {t['failed']} "
            f"fallback-only {t['fallback']} skipped {t['skipped']}; {t['seconds']:.0f}s")
    return "\n".join(lines)


def markdown(data: dict) -> str:
    m, totals = data["meta"], data["totals"]
    paths = list(totals)
    out = ["# OpInfo conformance report", "",
           "PyTorch's OpInfo database (`op_db`, torch " + m["torch"] + ") run sample by sample on "
           "`hlo` against CPU eager, per path. Generated by `make conformance` "
           "(`python -m tests.conformance.run --full`); do not edit by hand.", "",
           ] + [_run_line(r) for r in m.get("runs", [m])] + [
           f"- OpInfos selected: {m['ops_selected']}"]
    for path, why in m.get("unavailable_paths", {}).items():
        out.append(f"- path **{path}** not run: {why}")
    out += ["", "## Totals", "",
            "| | " + " | ".join(paths) + " |", "|---|" + "---|" * len(paths)]

    def row(label, fn):
        out.append(f"| {label} | " + " | ".join(str(fn(totals[p])) for p in paths) + " |")

    row("OpInfos passing every sample", lambda t: f"**{t['opinfos_all_pass']}** / {t['opinfos']}")
    row("float32 OpInfos passing every float32 sample",
        lambda t: f"**{t['float32_all_pass']}** / {t['float32_opinfos']}")
    row("in-place variants passing every sample",
        lambda t: f"**{t['inplace_all_pass']}** / {t['inplace_variants']}")
    row("partial_views (as_strided) passes", lambda t: {None: "-", True: "yes", False: "no"}[
        t["partial_views_pass"]])
    row("OpInfos skipped (skips.py)", lambda t: t["opinfos_skipped"])
    row("samples passed", lambda t: t["passed"])
    row("samples failed", lambda t: t["failed"])
    row("samples matching only through CPU fallback", lambda t: t["fallback"])
    row("samples skipped", lambda t: t["skipped"])
    row("op rows with CPU fallback", lambda t: t["ops_with_fallback"])
    row("CPU-fallback op calls (aten::*)", lambda t: sum(t["fallback_ops"].values()))
    row("seconds in samples (sum over workers)", lambda t: f"{t['seconds']:.0f}")
    out += ["", "An OpInfo passes when every sample of every dtype run passed on the device: none "
            "failed and none needed CPU fallback (skipped samples allowed). Cells below are "
            "`passed/failed/fallback-only/skipped` samples over the dtypes listed.", ""]
    for path in paths:
        top = list(totals[path]["fallback_ops"].items())[:15]
        if top:
            out.append(f"Most frequent CPU fallbacks on {path}: " +
                       ", ".join(f"`{k}` {v}" for k, v in top))
            out.append("")
    out += _rules_md(data["comparison"])
    out += ["## Per op", "",
            "| op | variant | dtypes | " + " | ".join(paths) + " | CPU fallback | first error |",
            "|---|---|---|" + "---|" * len(paths) + "---|---|"]
    for e in data["ops"]:
        cells = [_cell(e["paths"].get(p)) for p in paths]
        fb = sorted({k.removeprefix("aten::") for p in e["paths"].values()
                     for k in p["fallback_ops"]})
        err = next((f"{p}: {e['paths'][p]['first_error']}" for p in paths
                    if e["paths"].get(p, {}).get("first_error")), "")
        if not err:
            err = next((f"skipped: {e['paths'][p]['skip_reason']}" for p in paths
                        if e["paths"].get(p, {}).get("skip_reason")
                        and e["paths"][p]["passed"] == 0), "")
        out.append(f"| {e['op']} | {e['variant'] or ''} | {','.join(e['dtypes'])} | "
                   + " | ".join(cells) + f" | {_md(', '.join(fb), 60)} | {_md(err)} |")
    return "\n".join(out) + "\n"


def _run_line(m: dict) -> str:
    dtypes = ", ".join(m.get("dtypes") or ["float32", "int64", "bool", "bfloat16"])  # (older runs)
    return (f"- paths **{', '.join(m['paths'])}**: date {m['date']}, commit {m['commit']}, jax "
            f"{m['jax']}; wall time **{m['wall_seconds'] / 60:.1f} min** "
            f"({m['wall_seconds']:.0f} s) with {m['jobs']} worker process(es); dtypes {dtypes}; "
            f"samples per op and dtype capped at {m['cap']} (bfloat16: {max(m['cap'] // 2, 1)}), "
            f"every distinct kind of sample first" + (f". {m['note']}" if m.get("note") else ""))


def merge(*datasets: dict) -> dict:
    """One report from runs over different paths (each path's column comes from one run)."""
    runs, totals, by_key = [], {}, {}
    order = []
    for data in datasets:
        runs += data["meta"].get("runs", [data["meta"]])
        totals.update(data["totals"])
        for e in data["ops"]:
            key = (e["op"], e["variant"])
            if key not in by_key:
                by_key[key] = {**e, "dtypes": list(e["dtypes"]), "paths": {}}
                order.append(key)
            merged = by_key[key]
            merged["dtypes"] += [d for d in e["dtypes"] if d not in merged["dtypes"]]
            merged["paths"].update(e["paths"])
    meta = {**datasets[0]["meta"], "runs": runs,
            "paths": [p for r in runs for p in r["paths"]],
            "ops_selected": max(d["meta"]["ops_selected"] for d in datasets)}
    return {"meta": meta, "totals": totals,
            "comparison": {**datasets[0]["comparison"], **datasets[-1]["comparison"]},
            "ops": [by_key[k] for k in order]}


def rows_of(data: dict) -> list[dict]:
    """A report's cells back as per-dtype rows (what ``build`` takes): to combine runs over the
    same paths and different dtypes. A cell's error, fallback ops and seconds go to the dtype
    its first error names (else its first dtype)."""
    rows = []
    for e in data["ops"]:
        for path, p in e["paths"].items():
            named = p["first_error"][1:].split("]", 1)[0] if p["first_error"].startswith("[") \
                else None
            dtypes = list(p.get("by_dtype") or {"-": [p["passed"], p["failed"], p["fallback"],
                                                        p["skipped"]]})
            owner = named if named in dtypes else dtypes[0]
            for dt in dtypes:
                counts = (p.get("by_dtype") or {}).get(dt) or [p["passed"], p["failed"],
                                                               p["fallback"], p["skipped"]]
                mine = dt == owner
                rows.append({"op": e["op"], "variant": e["variant"], "path": path, "dtype": dt,
                             "passed": counts[0], "failed": counts[1], "fallback": counts[2],
                             "skipped": counts[3], "seconds": p["seconds"] if mine else 0.0,
                             "first_error": p["first_error"].split("] ", 1)[-1]
                             if mine and p["first_error"] else "",
                             "skip_reason": p["skip_reason"],
                             "fallback_ops": p["fallback_ops"] if mine else {}})
    return rows


def merge_dtypes(*datasets: dict) -> dict:
    """One report from runs over the same paths and different dtypes (op_db gives the order).
    A later run replaces an earlier one's cells for the same op, variant, path and dtype (a
    rerun of the ops a fix touched)."""
    from torch.testing._internal.common_methods_invocations import op_db
    cells = {}
    for d in datasets:
        for r in rows_of(d):
            cells[(r["op"], r["variant"], r["path"], r["dtype"])] = r
    rows = list(cells.values())
    runs = [r for d in datasets for r in d["meta"].get("runs", [d["meta"]])]
    meta = {**datasets[0]["meta"], "runs": runs,
            "ops_selected": max(d["meta"]["ops_selected"] for d in datasets)}
    return build(rows, meta, op_db, list(range(len(op_db))))


def _rules_md(c: dict) -> list[str]:
    tol = ", ".join(f"{k} rtol {v['rtol']:g} atol {v['atol']:g}"
                    for k, v in c["default_tolerances"].items())
    out = ["## How results are compared", "",
           f"- Tolerances, by each output's dtype: {tol} (torch.testing.assert_close's defaults); "
           "int and bool outputs exact (also for float samples); Python floats as float32.",
           "- An op's own `toleranceOverride`/`precisionOverride` in op_db (for CPU or any "
           "device type) loosens its dtype's tolerance: that is PyTorch's statement of how far "
           "two correct implementations may differ.",
           "- Extra looser tolerances (tests/conformance/skips.py `TOLERANCES`): " +
           (", ".join(f"{k} ({v['reason']})" for k, v in c["extra_overrides"].items()) or "none"),
           f"- Random ops ({len(c['random_ops'])}: {', '.join(c['random_ops'])}): {c['random_rule']}.",
           f"- Uninitialised outputs ({', '.join(c['metadata_only'])}): shape and dtype only.",
           "- Outputs unique only up to sign (" + ", ".join(c.get("sign_aligned", {})) + "): "
           "each singular/eigenvector aligned to eager's phase, then compared as usual.",
           "- Indices unique only up to ties (" + ", ".join(c.get("tie_aligned", {})) + "): "
           "an index naming an element equal to the one eager's names is aligned to eager's, "
           "then compared as usual; sort and topk indices must name distinct elements; stable "
           "sorts are compared as they are.",
           "- In-place variants run on a clone of the input; samples where eager raises (e.g. the "
           "result dtype cannot be cast to the input's) are skipped; the mutated input and the "
           "returned tensor are compared, and the result must be the input itself when eager's is.",
           "- Strides are not compared.",
           "- Skipped OpInfos: " + ("; ".join(f"{k} ({v})" for k, v in c["skipped_ops"].items())
                                    or "none"),
           ""]
    return out


def write(data: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "REPORT.md"), "w") as f:
        f.write(markdown(data))
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=False, default=str)
        f.write("\n")


if __name__ == "__main__":
    # python -m tests.conformance.report OUT_DIR A.json B.json ...: merge runs over different paths
    import sys
    # python -m tests.conformance.report --dtypes OUT_DIR A.json B.json: same paths, other dtypes
    args = sys.argv[1:]
    by_dtype = args[0] == "--dtypes"
    out_dir, *files = args[1:] if by_dtype else args
    loaded = []
    for name in files:
        with open(name) as f:
            loaded.append(json.load(f))
    merged = merge_dtypes(*loaded) if by_dtype else merge(*loaded)
    write(merged, out_dir)
    print(summary(merged) if "wall_seconds" in merged["meta"] else "merged")
