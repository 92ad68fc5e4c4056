"""The report's PNG plots: reliability, risk-coverage, AUROC, decisions, alpha sweep, bound.

Pure drawing of a report dict (:func:`~sidecar.lab.report.evaluate.build_report`)
with matplotlib's Agg backend; matplotlib is imported only when plotting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_plots"]


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """PNG plots of the report into ``out``; returns the files written."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, plot in (
        ("reliability.png", _plot_reliability),
        ("risk_coverage.png", _plot_risk_coverage),
        ("auroc.png", _plot_auroc),
        ("decisions.png", _plot_decisions),
        ("alpha_sweep.png", _plot_alpha_sweep),
        ("coverage_bound.png", _plot_bound),
    ):
        fig = plot(plt, report)
        if fig is None:
            continue
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    return written


def _plot_reliability(plt: Any, report: dict[str, Any]) -> Any:
    cal = report["calibration"]
    if not cal.get("available"):
        return None
    fig, (ax, hx) = plt.subplots(
        2, 1, figsize=(5.5, 6.5), gridspec_kw={"height_ratios": [3, 1]}, sharex=True
    )
    used = [b for b in cal["bins"] if b["count"]]
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect calibration")
    ax.plot(
        [b["mean_confidence"] for b in used],
        [b["accuracy"] for b in used],
        "o-",
        label="calibrated confidence",
    )
    ax.set_ylabel("accuracy in bin")
    ax.set_title(
        f"Reliability (n={report['n']}): ECE {cal['ece']:.3f}, Brier {cal['brier']:.3f}, "
        f"NLL {cal['nll']:.3f}",
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=8)
    hx.bar(
        [(b["lower"] + b["upper"]) / 2 for b in cal["bins"]],
        [b["count"] for b in cal["bins"]],
        width=[b["upper"] - b["lower"] for b in cal["bins"]],
        edgecolor="black",
    )
    hx.set_xlabel("predicted probability of a correct answer")
    hx.set_ylabel("answers")
    return fig


def _plot_risk_coverage(plt: Any, report: dict[str, Any]) -> Any:
    """Error among allowed vs allow rate over confidence thresholds; the policy's point marked."""
    cert = report["certified_allow"]
    curve = cert["risk_coverage"]
    if not curve:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    ax.plot(
        [c["allow_rate"] for c in curve],
        [c["error_rate_allowed"] for c in curve],
        "-",
        label="allow when confidence >= t",
    )
    if cert["certified_risk"] is not None:
        ax.axhline(
            cert["certified_risk"],
            ls="--",
            c="tab:red",
            lw=1,
            label=f"certified risk {cert['certified_risk']:g} (delta {cert['certified_delta']:g})",
        )
    if cert["error_rate_allowed"] is not None:
        err = cert["error_rate_allowed"]
        ax.errorbar(
            [cert["allow_rate"]],
            [err],
            yerr=[[err - cert["error_rate_allowed_low"]], [cert["error_rate_allowed_high"] - err]],
            fmt="o",
            c="tab:red",
            capsize=5,
            label=f"policy's allows ({cert['allowed']}), {cert['interval']}",
        )
    ax.set_xlabel("allow rate")
    ax.set_ylabel("error among allowed answers")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Risk-coverage (n={report['n']})", fontsize=9)
    return fig


def _plot_auroc(plt: Any, report: dict[str, Any]) -> Any:
    named = [
        (v["title"], v["auroc"], v["n"])
        for v in report["signals"].values()
        if v["auroc"] is not None
    ]
    if not named:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    ax.barh([f"{t} (n={k})" for t, _, k in named], [a for _, a, _ in named])
    ax.axvline(0.5, ls="--", c="grey", lw=1)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("AUROC for detecting wrong answers")
    for i, (_, a, _) in enumerate(named):
        ax.text(a + 0.01, i, f"{a:.3f}", va="center", fontsize=8)
    return fig


def _plot_decisions(plt: Any, report: dict[str, Any]) -> Any:
    dec = report["decisions"]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    names = list(dec)
    ax.bar(names, [dec[d]["n"] for d in names], color=["tab:green", "tab:orange", "tab:red"])
    for i, d in enumerate(names):
        er = dec[d]["error_rate"]
        ax.text(i, dec[d]["n"], "" if er is None else f"error {er:.2f}", ha="center", va="bottom")
    ax.set_ylabel("answers")
    ax.set_title("Decisions and the share of wrong answers in each", fontsize=9)
    return fig


def _plot_alpha_sweep(plt: Any, report: dict[str, Any]) -> Any:
    sweep = report["alpha_sweep"]
    if not sweep:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    alphas = [p["alpha"] for p in sweep]
    ax.plot(alphas, [p["m1_mean"] for p in sweep], "o-", label="mean m1")
    ax.plot(alphas, [p["m2_mean"] for p in sweep], "s-", label="mean m2")
    if all(p["answer_chunk_trusted"] is not None for p in sweep):
        ax.plot(
            alphas,
            [p["answer_chunk_trusted"] for p in sweep],
            "^-",
            label="answer-bearing chunk trusted",
        )
    ax.plot(alphas, [1 - a for a in alphas], ls="--", c="grey", label="1 - alpha")
    ax.set_xlabel("alpha")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(f"Certification vs alpha on the report's questions (n={report['n']})", fontsize=9)
    return fig


def _plot_bound(plt: Any, report: dict[str, Any]) -> Any:
    b = report["coverage_bound"]
    if b.get("bound") is None:
        return None
    fig, ax = plt.subplots(figsize=(5.0, 3.8))
    ax.errorbar(
        [0],
        [b["bound"]],
        yerr=[[b["bound"] - b["bound_low"]], [b["bound_high"] - b["bound"]]],
        fmt="o",
        capsize=6,
        label="bound c*eps + (1-c)*delta",
    )
    meas = b["measured"]
    if meas["estimate"] is not None:
        ax.errorbar(
            [1],
            [meas["estimate"]],
            yerr=[[meas["estimate"] - meas["low"]], [meas["high"] - meas["estimate"]]],
            fmt="s",
            capsize=6,
            c="tab:red",
            label="measured hallucination rate",
        )
    ax.set_xticks([0, 1], ["bound", "measured"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(0, 1)
    ax.set_title(
        f"Coverage bound ({b['status']}): c={b['coverage']['estimate']:.2f}, "
        f"delta from {b['delta_source']}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right")
    return fig
