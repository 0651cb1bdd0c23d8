"""Issue 21 (a): what the response memory can give self-consistency at best, under
sampling and a row budget, measured with the model's own probabilities.

At every decoding step a probe drafter proposes the union of what recall can offer: the
request's own text (the dynamic automaton's frequency tree at its longest earlier match
and the most recent occurrence's chain, as ``portfolio`` drafts them) and, tagged apart,
every memory segment's frequency tree at its match. The engine verifies that whole tree
(fixed mode, one forward) and hands the probe every node's logits. Under lossless
sampling of a deterministic tree (``spec/verify.py``) a node is accepted with
probability P(node) = the product of the model's probabilities of the tokens on its path
(siblings are tried in turn, so the children's chances add), and a tree's expected
accepted tokens are the sum of P over its nodes. The best tree of B nodes drawn from a
set of nodes is their B largest P (P never grows along a path, so they form a tree).
So per step and budget B: E_own(B) from the own-text nodes alone, E_all(B) from all of
them, at the same state of the same request (a paired comparison). Expected tokens a
step are 1 + E; their ratio is the memory's gain in steps at that budget, for *any*
recall tree chosen from those sources with perfect knowledge of the model's
probabilities (no drafter knows them). The cost curve then prices a step of 1 + B rows.

The realised answers are sampled by the engine from the big tree (exactly the model's
distribution), 8 questions x 8 samples at T = 0.7, one tenant per question, the memory
fed as the server feeds it.

    .venv/bin/python scripts/exp_memory_tree_bound.py [--questions 8] [--out bench_out/tree_bound]

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recallspec.bench.repeat_workloads import GSM8K_INSTRUCTION
from recallspec.bench.suites import SuiteSelection, load_suite
from recallspec.drafters.lookup import LookupDrafter
from recallspec.drafters.sam import SamDrafter, SamOptions
from recallspec.engine import Engine
from recallspec.recall.view import MEMORY
from recallspec.spec.sampling import SamplingParams, probabilities
from recallspec.spec.tree import DraftTree

BUDGETS = (1, 2, 4, 8, 16, 32)
SOURCE_NODES = 48  # nodes asked of each source's tree
MAX_NODES = 160  # the union's cap (the engine's max_draft_nodes)
# Shorter contexts too: each source's tree after matching only the text's last n tokens
# (more occurrences, so more continuations than at the longest match).
CONTEXTS = (1, 2, 3, 4, 6, 8, 12, 16)


class Union:
    """A trie of token paths, each node tagged with the kinds of source that hold it."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.own: list[bool] = []
        self._child: dict[tuple[int, int], int] = {}

    def add(self, tree: DraftTree, own: bool) -> None:
        ids: list[int] = []
        for tok, par in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True):
            p = -1 if par < 0 else ids[par]
            if p == -2 or (len(self.tokens) >= MAX_NODES and (p, tok) not in self._child):
                ids.append(-2)  # over the cap: this node and its subtree are dropped
                continue
            node = self._child.get((p, tok))
            if node is None:
                node = len(self.tokens)
                self._child[(p, tok)] = node
                self.tokens.append(tok)
                self.parents.append(p)
                self.own.append(own)
            elif own:
                self.own[node] = True
            ids.append(node)

    def tree(self) -> DraftTree:
        return DraftTree.from_lists(self.tokens, self.parents)


class BoundProbe(SamDrafter):
    """Proposes the union (see the module docstring) and records E_own / E_all."""

    name = "bound-probe"
    needs_logits = True

    def __init__(self, temperature: float) -> None:
        super().__init__(SamOptions(max_tokens=MAX_NODES))
        self.latest = LookupDrafter(max_ngram=4, min_ngram=1, max_tokens=SOURCE_NODES,
                                    name="latest")
        self.params = SamplingParams(temperature=temperature)
        self.own_flags: dict[int, dict[tuple[int, ...], bool]] = {}
        self.rows: list[tuple[list[float], list[float]]] = []  # per step: own, all

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        super().start(rid, prompt)
        self.latest.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        st = self._states[rid]
        u = Union()
        if st.dyn.match_length > 0:
            u.add(st.dyn.draft_tree(SOURCE_NODES), own=True)
            u.add(self.latest.propose(rid, SOURCE_NODES), own=True)
        memory = [(src.index, cur) for src, cur in st.recall.cursors
                  if src.kind == MEMORY and cur.match_length > 0]
        for _, cur in memory:
            u.add(cur.draft_tree(SOURCE_NODES), own=False)
        text = st.dyn.tokens
        for n in CONTEXTS:
            tail = np.ascontiguousarray(text[-n:], np.uint32)
            cur = st.dyn.cursor()
            cur.advance(tail)
            if cur.match_length:
                u.add(cur.draft_tree(SOURCE_NODES // 4), own=True)
            for index, _ in memory:
                cur = index.cursor()
                cur.advance(tail)
                if cur.match_length:
                    u.add(cur.draft_tree(SOURCE_NODES // 4), own=False)
        tree = u.tree()
        if len(tree) > max_nodes:  # the slot's room: keep the first nodes (parents first)
            tree = DraftTree.from_lists(u.tokens[:max_nodes], u.parents[:max_nodes])
        self.own_flags[rid] = _paths(tree, u.own)
        return tree

    def observe(self, rid: int, accepted: Sequence[int], tree: DraftTree,
                logits: torch.Tensor | None) -> None:
        flags = self.own_flags.pop(rid, {})  # node path -> own-text node
        # The engine may cut the tree (depth: the tokens still wanted); match by path.
        own = [flags[k] for k in _paths(tree, [False] * len(tree))]
        if logits is not None and len(tree):
            p = probabilities(logits.float(), self.params)
            toks, pars = tree.tokens.tolist(), tree.parents.tolist()
            prob = [0.0] * len(toks)
            for i, (t, q) in enumerate(zip(toks, pars, strict=True)):
                prob[i] = (1.0 if q < 0 else prob[q]) * float(p[q + 1, t])
            self.rows.append(([x for x, o in zip(prob, own, strict=True) if o], prob))
        super().observe(rid, accepted, tree, logits)
        self.latest.observe(rid, accepted, tree, None)

    def stop(self, rid: int) -> None:
        super().stop(rid)
        self.latest.stop(rid)


def _paths(tree: DraftTree, flags: Sequence[bool]) -> dict[tuple[int, ...], bool]:
    """Each node's root path (its tokens) -> its flag, in node order."""
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True):
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    return dict(zip(paths, flags, strict=False))


def expected(prob: list[float], budget: int) -> float:
    return float(np.sort(np.asarray(prob))[::-1][:budget].sum()) if prob else 0.0


OVERHEADS_MS = (0.0, 0.5, 1.0, 1.5, 2.0)  # the sensitivity rows


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Sample the answers with the probe; expected tokens a step per budget; the curve."""
    eng = Engine.load(None, dtype="quantized", threads=2, mode="fixed", memory_tokens=200_000,
                      max_draft_nodes=MAX_NODES)
    probe = BoundProbe(args.temperature)
    probe.bind(eng.drafter_context())  # an instance passed as is: give it the recall view
    qs = load_suite("gsm8k", SuiteSelection(per_category=args.questions), None)
    t0 = time.perf_counter()
    tokens = 0
    for q in qs:
        for k in range(args.samples):
            r = eng.chat([{"role": "user", "content": GSM8K_INSTRUCTION + q.turns[0]}],
                         SamplingParams(temperature=args.temperature,
                                        max_new_tokens=args.max_tokens, seed=k),
                         drafter=probe, tenant=f"gsm8k-{q.question_id}")
            tokens += r.new_tokens
        print(f"question {q.question_id}: {len(probe.rows)} steps so far", flush=True)
    out: dict[str, Any] = {"questions": args.questions, "samples": args.samples,
                           "temperature": args.temperature, "tokens": tokens,
                           "steps": len(probe.rows), "seconds": time.perf_counter() - t0,
                           "realised_tokens_per_step": tokens / max(1, len(probe.rows)),
                           "budgets": [{
                               "nodes": b,
                               "tokens_per_step_own": float(np.mean(
                                   [1 + expected(o, b) for o, _ in probe.rows])),
                               "tokens_per_step_own_and_memory": float(np.mean(
                                   [1 + expected(a, b) for _, a in probe.rows])),
                           } for b in BUDGETS]}
    return out, eng.cost_curve()


def price(out: dict[str, Any], curve: Any, overhead_ms: float) -> float:
    """Fill in each budget's step cost at ``overhead_ms`` a step outside the forward;
    return the best time gain (best B with memory over best B without)."""
    one = curve.rows_cost(1) + overhead_ms / 1e3
    for b in out["budgets"]:
        cost = (curve.rows_cost(1 + b["nodes"]) + overhead_ms / 1e3) / one
        b.update(memory_gain_in_steps=b["tokens_per_step_own_and_memory"]
                 / b["tokens_per_step_own"], step_cost_vs_one_row=cost,
                 tokens_per_row_time_own=b["tokens_per_step_own"] / cost,
                 tokens_per_row_time_memory=b["tokens_per_step_own_and_memory"] / cost)
    return (max(b["tokens_per_row_time_memory"] for b in out["budgets"])
            / max(b["tokens_per_row_time_own"] for b in out["budgets"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--overhead-ms", type=float, default=1.0,
                    help="a step's time outside its forward (the engine's own measure, "
                         "planner.step_overhead, on sampled self-consistency steps with "
                         "memory trees: median 1.06 ms on the Zen 4)")
    ap.add_argument("--from-json", help="re-price an earlier run's OUT.json (no sampling)")
    ap.add_argument("--out", default="bench_out/tree_bound")
    args = ap.parse_args()
    if args.from_json:
        out = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        curve = Engine.load(None, dtype="quantized", threads=2, mode="adaptive").cost_curve()
    else:
        out, curve = measure(args)
    out["sensitivity"] = {str(o): price(out, curve, o) for o in OVERHEADS_MS}
    out["overhead_ms"] = args.overhead_ms
    out["best_time_gain"] = price(out, curve, args.overhead_ms)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(out, indent=1), encoding="utf-8")
    lines = [f"Self-consistency, {out['questions']} GSM8K questions x {out['samples']} samples "
             f"at T = {out['temperature']}, {out['steps']} steps: expected tokens a step of "
             "the best B-node recall tree (model probabilities known), own text alone vs "
             "own text + memory; step cost from the cost curve plus "
             f"{args.overhead_ms} ms a step outside the forward.", "",
             "| B nodes | own | own + memory | gain in steps | step cost (x 1 row) | "
             "tokens per 1-row time, own | with memory |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {b['nodes']} | {b['tokens_per_step_own']:.3f} | "
              f"{b['tokens_per_step_own_and_memory']:.3f} | {b['memory_gain_in_steps']:.3f}x | "
              f"{b['step_cost_vs_one_row']:.2f} | {b['tokens_per_row_time_own']:.3f} | "
              f"{b['tokens_per_row_time_memory']:.3f} |" for b in out["budgets"]]
    lines += ["", f"Best over B with memory / best over B without: "
              f"**{out['best_time_gain']:.3f}x**. At other step overheads: "
              + ", ".join(f"{float(o):.1f} ms {g:.3f}x" for o, g in out["sensitivity"].items())
              + "."]
    md = "\n".join(lines) + "\n"
    path.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
