"""A LightGBM regression forest compiled into flat numpy arrays, for microsecond inference.

Why not ``lightgbm.Booster.predict``? The admission predictor runs on every arrival and a call
into the LightGBM C API costs 50-100 µs of fixed overhead, several times the work of walking 100
small trees. The admission model has only a few features, so we *bin* each feature once by the
sorted unique split thresholds of the whole forest: every split ``x <= t`` then becomes a
comparison of small integers, each tree becomes a lookup table over its own threshold grid, and
the forest becomes (when small enough) one precomputed table over the global grid, read with
``len(features)`` ``bisect`` calls and one index.

Semantics copied from LightGBM's ``Tree::NumericalDecision`` (``include/LightGBM/tree.h``):

* ``missing_type`` (bits 2-3 of ``decision_type``): None=0, Zero=1, NaN=2.
* NaN with missing type other than NaN is replaced by 0.0 first.
* missing type Zero and ``|x| <= 1e-35``, or missing type NaN and ``x`` is NaN: go to the
  ``default_left`` side (bit 1 of ``decision_type``).
* otherwise go left iff ``x <= threshold``.
* the prediction is the sum of the trees' leaf values **in tree order, starting from 0.0**
  (shrinkage and the initial score are already folded into the leaf values in the text model).

Rows that need a missing-value rule (NaN anywhere, or a near-zero value on a feature split with
missing type Zero) take an exact per-row tree walk; all others take the table path. Both paths
reproduce ``Booster.predict(raw_score=True)`` bit for bit (the per-tree-table path sums with
numpy in the same order; see ``tests/test_predictors_admission.py``).

Only numerical splits of an identity-output regression objective are supported: the model text
is refused otherwise (categorical splits, linear trees, random-forest averaging, objectives with
an output transform).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import PredictorError, PredictorInputError

#: LightGBM's kZeroThreshold
ZERO_THRESHOLD = 1e-35
MISSING_NONE, MISSING_ZERO, MISSING_NAN = 0, 1, 2
#: objectives whose raw score is the prediction (no exp/sigmoid transform)
IDENTITY_OBJECTIVES = (
    "regression",
    "regression_l2",
    "regression_l1",
    "huber",
    "fair",
    "quantile",
    "mape",
)
#: the whole-forest table is precomputed when it has at most this many cells (8 bytes each)
DEFAULT_GRID_LIMIT = 1 << 20


@dataclass(frozen=True)
class Tree:
    """One parsed LightGBM tree: internal nodes 0..n-2, children < 0 are leaves ``~child``."""

    split_feature: np.ndarray  # (n_internal,) int
    threshold: np.ndarray  # (n_internal,) float64
    default_left: np.ndarray  # (n_internal,) bool
    missing_type: np.ndarray  # (n_internal,) int
    left_child: np.ndarray  # (n_internal,) int
    right_child: np.ndarray  # (n_internal,) int
    leaf_value: np.ndarray  # (n_leaves,) float64

    def leaf_of(self, x: Sequence[float]) -> int:
        """Exact LightGBM walk for one row (handles every missing-value rule)."""
        if len(self.leaf_value) == 1:
            return 0
        node = 0
        while node >= 0:
            v = float(x[self.split_feature[node]])
            mt = self.missing_type[node]
            if v != v and mt != MISSING_NAN:
                v = 0.0
            if (mt == MISSING_ZERO and -ZERO_THRESHOLD <= v <= ZERO_THRESHOLD) or (
                mt == MISSING_NAN and v != v
            ):
                left = bool(self.default_left[node])
            else:
                left = v <= self.threshold[node]
            node = int(self.left_child[node] if left else self.right_child[node])
        return ~node


def parse_lightgbm_text(text: str) -> tuple[dict[str, str], list[Tree]]:
    """Header key/values and the trees of a LightGBM text model (``Booster.model_to_string()``)."""
    header: dict[str, str] = {}
    blocks: list[dict[str, str]] = []
    current = header
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line == "end of trees":
            break
        if line.startswith("Tree="):
            current = {}
            blocks.append(current)
            continue
        if "=" in line:
            k, v = line.split("=", 1)
            current[k] = v
    if header.get("version") is None or "max_feature_idx" not in header:
        raise PredictorError(
            "not a LightGBM text model (no version/max_feature_idx "
            "header); save it with Booster.save_model"
        )
    objective = header.get("objective", "").split(" ")[0]
    if objective not in IDENTITY_OBJECTIVES:
        raise PredictorError(
            f"LightGBM objective {objective!r} has an output "
            f"transform; only {IDENTITY_OBJECTIVES} compile"
        )
    if "average_output" in header:
        raise PredictorError(
            "LightGBM random-forest mode (average_output) "
            "is not supported; train with boosting=gbdt"
        )
    if int(header.get("num_tree_per_iteration", "1")) != 1:
        raise PredictorError(
            "multi-output LightGBM models are not supported; the admission model is one regressor"
        )
    if not blocks:
        raise PredictorError("the LightGBM model has no trees")
    trees = [_parse_tree(i, b) for i, b in enumerate(blocks)]
    return header, trees


def _parse_tree(i: int, b: dict[str, str]) -> Tree:
    def arr(key: str, dtype: type) -> np.ndarray:
        if key not in b or b[key] == "":
            return np.zeros(0, dtype=dtype)
        return np.array(b[key].split(" "), dtype=dtype)

    try:
        n_leaves = int(b["num_leaves"])
        if int(b.get("num_cat", "0")) != 0:
            raise PredictorError(
                f"tree {i} has categorical splits; the "
                "admission model compiles numerical splits only"
            )
        if int(b.get("is_linear", "0")) != 0:
            raise PredictorError(f"tree {i} is a linear tree; train without linear_tree")
        leaf_value = arr("leaf_value", np.float64)
        if n_leaves == 1:
            z = np.zeros(0, dtype=np.int64)
            return Tree(z, np.zeros(0), np.zeros(0, bool), z, z, z, leaf_value[:1])
        decision = arr("decision_type", np.int64)
        tree = Tree(
            split_feature=arr("split_feature", np.int64),
            threshold=arr("threshold", np.float64),
            default_left=(decision & 2) != 0,
            missing_type=(decision >> 2) & 3,
            left_child=arr("left_child", np.int64),
            right_child=arr("right_child", np.int64),
            leaf_value=leaf_value,
        )
    except (KeyError, ValueError) as e:
        raise PredictorError(
            f"LightGBM tree {i} is malformed ({e}); the model text is truncated or edited"
        ) from e
    if np.any(decision & 1):
        raise PredictorError(
            f"tree {i} has categorical splits; the admission model compiles numerical splits only"
        )
    n_int = n_leaves - 1
    if (
        any(
            len(a) != n_int
            for a in (tree.split_feature, tree.threshold, tree.left_child, tree.right_child)
        )
        or len(leaf_value) != n_leaves
    ):
        raise PredictorError(
            f"LightGBM tree {i} has inconsistent array "
            "lengths; the model text is truncated or edited"
        )
    return tree


class CompiledForest:
    """The forest as binned lookup tables. ``predict_raw`` equals
    ``Booster.predict(raw_score=True)``."""

    def __init__(
        self, trees: Sequence[Tree], n_features: int, *, grid_limit: int = DEFAULT_GRID_LIMIT
    ) -> None:
        self.trees = list(trees)
        self.n_features = int(n_features)
        for t in self.trees:
            if len(t.split_feature) and int(t.split_feature.max()) >= self.n_features:
                raise PredictorError(
                    f"a tree splits on feature {int(t.split_feature.max())} "
                    f"but the model has {n_features}"
                )
        #: per feature: the sorted unique thresholds of the whole forest
        self.cuts: list[np.ndarray] = []
        for f in range(self.n_features):
            thr = [t.threshold[t.split_feature == f] for t in self.trees if len(t.split_feature)]
            self.cuts.append(np.unique(np.concatenate(thr)) if thr else np.zeros(0))
        self._cut_lists = [c.tolist() for c in self.cuts]
        #: features where a value near zero needs the exact walk (missing type Zero)
        self._zero_features = sorted(
            {
                int(f)
                for t in self.trees
                for f, m in zip(t.split_feature, t.missing_type)
                if m == MISSING_ZERO
            }
        )
        self._build_tables()
        n_cells = int(np.prod([len(c) + 1 for c in self.cuts], dtype=np.float64))
        self.grid: np.ndarray | None = self._build_grid() if n_cells <= grid_limit else None

    # -- building ---------------------------------------------------------------------------
    def _build_tables(self) -> None:
        """Per tree: a table over its own threshold grid; per feature: global bin -> flat offset."""
        n_trees = len(self.trees)
        n_bins = [len(c) + 1 for c in self.cuts]
        offsets = [np.zeros((n_bins[f], n_trees), dtype=np.int64) for f in range(self.n_features)]
        values: list[np.ndarray] = []
        base = 0
        for ti, t in enumerate(self.trees):
            local_cuts = [
                np.unique(t.threshold[t.split_feature == f]) for f in range(self.n_features)
            ]
            shape = [len(c) + 1 for c in local_cuts]
            strides = np.cumprod([1, *shape[::-1]])[:-1][::-1]  # C order
            # the local index of each internal node's threshold within its feature's local cuts
            node_local = np.array(
                [
                    int(np.searchsorted(local_cuts[f], thr))
                    for f, thr in zip(t.split_feature, t.threshold)
                ],
                dtype=np.int64,
            )
            cells = (
                np.indices(shape).reshape(self.n_features, -1).T
            )  # every combination of local bins
            table = np.array(
                [t.leaf_value[self._walk_bins(t, node_local, c)] for c in cells], dtype=np.float64
            )
            values.append(table)
            for f in range(self.n_features):
                g_of_local = np.searchsorted(
                    self.cuts[f], local_cuts[f]
                )  # global index of each local cut
                # a value in global bin g exceeds exactly the local cuts whose global index is < g
                local_bin = np.searchsorted(g_of_local, np.arange(n_bins[f]), side="left")
                offsets[f][:, ti] = local_bin * strides[f] + (base if f == 0 else 0)
            base += len(table)
        self._offsets = offsets
        self._values = np.concatenate(values)

    @staticmethod
    def _walk_bins(t: Tree, node_local: np.ndarray, bins: np.ndarray) -> int:
        if len(t.leaf_value) == 1:
            return 0
        node = 0
        while node >= 0:
            # x in local bin b is <= the local cut j iff b <= j
            left = bins[t.split_feature[node]] <= node_local[node]
            node = int(t.left_child[node] if left else t.right_child[node])
        return ~node

    def _build_grid(self) -> np.ndarray:
        """Whole-forest table over the global grid, summed in tree order (so bit-exact)."""
        shape = tuple(len(c) + 1 for c in self.cuts)
        grid = np.zeros(shape, dtype=np.float64)
        for ti in range(len(self.trees)):
            idx = np.zeros(shape, dtype=np.int64)
            for f in range(self.n_features):
                view = [1] * self.n_features
                view[f] = shape[f]
                idx = idx + self._offsets[f][:, ti].reshape(view)
            grid += self._values[idx]
        return grid

    # -- inference --------------------------------------------------------------------------
    def _needs_walk(self, X: np.ndarray) -> np.ndarray:
        mask = np.isnan(X).any(axis=1)
        for f in self._zero_features:
            mask |= np.abs(X[:, f]) <= ZERO_THRESHOLD
        return mask

    def predict_raw(self, X: np.ndarray) -> np.ndarray:
        """Raw scores for a batch ``(n, n_features)`` (float64)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise PredictorInputError(
                f"expected features of shape (n, {self.n_features}), got {X.shape}"
            )
        out = np.empty(len(X), dtype=np.float64)
        if len(X) == 0:
            return out
        walk = self._needs_walk(X)
        fast = ~walk
        if fast.any():
            Xf = X[fast]
            bins = [
                np.searchsorted(self.cuts[f], Xf[:, f], side="left") for f in range(self.n_features)
            ]
            if self.grid is not None:
                out[fast] = self.grid[tuple(bins)]
            else:
                idx = self._offsets[0][bins[0]]
                for f in range(1, self.n_features):
                    idx = idx + self._offsets[f][bins[f]]
                out[fast] = self._sum_in_tree_order(self._values[idx.T])
        for i in np.flatnonzero(walk):
            out[i] = self.walk_row(X[i])
        return out

    def predict_raw_one(self, x: Sequence[float]) -> float:
        """Raw score of one row: ``n_features`` bisects and one table read when the grid exists."""
        if len(x) != self.n_features:
            raise PredictorInputError(f"expected {self.n_features} features, got {len(x)}")
        bins = []
        for f in range(self.n_features):
            v = float(x[f])
            if v != v or (f in self._zero_features and -ZERO_THRESHOLD <= v <= ZERO_THRESHOLD):
                return self.walk_row(x)
            bins.append(bisect.bisect_left(self._cut_lists[f], v))
        if self.grid is not None:
            return float(self.grid[tuple(bins)])
        idx = self._offsets[0][bins[0]]
        for f in range(1, self.n_features):
            idx = idx + self._offsets[f][bins[f]]
        total = 0.0
        for v in self._values[
            idx
        ].tolist():  # tree order from 0.0, like LightGBM (not sum(): it compensates)
            total += v
        return total

    @staticmethod
    def _sum_in_tree_order(vals: np.ndarray) -> np.ndarray:
        """Column sums of ``(trees, n)`` adding rows in order from 0.0, as LightGBM does.

        ``np.sum`` may sum pairwise or in another order; one in-place add per tree is exact.
        """
        acc = np.zeros(vals.shape[1], dtype=np.float64)
        for row in vals:
            acc += row
        return acc

    def walk_row(self, x: Sequence[float]) -> float:
        """Exact per-row walk of every tree (the reference path, and the missing-value path)."""
        total = 0.0
        for t in self.trees:
            total += float(t.leaf_value[t.leaf_of(x)])
        return total

    @property
    def n_trees(self) -> int:
        return len(self.trees)

    @property
    def max_leaves(self) -> int:
        return max(len(t.leaf_value) for t in self.trees)
