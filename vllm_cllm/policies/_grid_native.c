/* The adaptive policy's whole-step arithmetic in C: valuing, choosing and sizing a step's
 * candidate grid, and counting last step's candidates against what vLLM committed.
 *
 * Each function does, in one pass, what vllm_cllm/policies/acceptance.py and
 * vllm_cllm/policies/adaptive.py do in numpy (grid_cells, grid_values, best_candidates,
 * draft_lengths_grid, observe_grid), with the same floating-point operations in the same order,
 * so that the results are the same to the last bit (tests/test_native.py compares them).
 * Built with -ffp-contract=off: a fused multiply-add would round differently.
 *
 * Arrays come as C-contiguous buffers (numpy arrays): int64 for tokens, cells, sizes and
 * counts of tokens; float64 for the table's counts, values and costs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* Take a C-contiguous buffer of items of `itemsize` bytes and at least `count` of them. */
static int take(PyObject *obj, Buf *buf, Py_ssize_t itemsize, Py_ssize_t count, int writable,
                const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &buf->view, flags) < 0)
        return -1;
    buf->held = 1;
    if (buf->view.itemsize != itemsize || buf->view.len < count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected at least %zd items of %zd bytes", name,
                     count, itemsize);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].view);
}

/* One draft position offered to the batch's sizing. */
typedef struct {
    double value;
    int64_t row;
    int64_t pos;
} Item;

/* Highest value first; equal values by row, then position: numpy's stable argsort of the
 * negated values over positions listed by row, then position. */
static int by_value(const void *a, const void *b) {
    const Item *x = (const Item *)a, *y = (const Item *)b;
    if (x->value > y->value) return -1;
    if (x->value < y->value) return 1;
    if (x->row != y->row) return x->row < y->row ? -1 : 1;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return 0;
}

/* choose(grid, sizes, previous, base, level, backed, restart_cells, tail, rooms, num_tokens,
 *        counts, vote_unit, num_previous, max_votes, costs, plain, margin1, batch, trust,
 *        batch_costs, cells, values, best, sized) -> (gain, cost)
 *
 * grid [R, S, K] the candidates (-1 past each); sizes [R, S] their lengths (a row without a
 * tail gets its restart block's: rooms[r] where num_tokens[r] > 0, else 0); previous [R] the
 * outcome cell; base [S, K] each slot's and column's cell without vote and outcome; level and
 * backed [R, S] each candidate's backing level and how many leading tokens are at it (None:
 * none); restart_cells [K] a restart block's cells in the tail's slot; counts [2, cells] the
 * table (trials, then accepted). Writes cells and values [R, S, K], best [R] (the chosen slot,
 * -1 for none) and sized [R] (the chosen candidates sized together, before the plain-decoding
 * check); returns the step's expected gain and cost at that sizing, which the caller checks
 * against drafting nothing (cost_model.beats_plain). */
static PyObject *choose(PyObject *self, PyObject *args) {
    PyObject *o_grid, *o_sizes, *o_previous, *o_base, *o_level, *o_backed, *o_restart;
    PyObject *o_rooms, *o_num_tokens, *o_counts, *o_costs, *o_batch_costs;
    PyObject *o_cells, *o_values, *o_best, *o_sized;
    Py_ssize_t R, S, K, tail, vote_unit, num_previous, max_votes, batch;
    double plain, margin1, trust;
    if (!PyArg_ParseTuple(args, "nnnOOOOOOOnOOOnnnOddndOOOOO", &R, &S, &K, &o_grid, &o_sizes,
                          &o_previous, &o_base, &o_level, &o_backed, &o_restart, &tail,
                          &o_rooms, &o_num_tokens, &o_counts, &vote_unit, &num_previous,
                          &max_votes, &o_costs, &plain, &margin1, &batch, &trust,
                          &o_batch_costs, &o_cells, &o_values, &o_best, &o_sized))
        return NULL;
    Buf b[16] = {{{0}}};
    int with_levels = o_level != Py_None;
    PyObject *result = NULL;
    Item *items = NULL;
    if (take(o_grid, &b[0], 8, R * S * K, 0, "grid") || take(o_sizes, &b[1], 8, R * S, 1, "sizes")
        || take(o_previous, &b[2], 8, R, 0, "previous") || take(o_base, &b[3], 8, S * K, 0, "base")
        || take(o_restart, &b[4], 8, K, 0, "restart_cells")
        || take(o_rooms, &b[5], 8, R, 0, "rooms")
        || take(o_num_tokens, &b[6], 8, R, 0, "num_tokens")
        || take(o_counts, &b[7], 8, 0, 0, "counts") || take(o_costs, &b[8], 8, K, 0, "costs")
        || take(o_batch_costs, &b[9], 8, batch * K + 1, 0, "batch_costs")
        || take(o_cells, &b[10], 8, R * S * K, 1, "cells")
        || take(o_values, &b[11], 8, R * S * K, 1, "values")
        || take(o_best, &b[12], 8, R, 1, "best") || take(o_sized, &b[13], 8, R, 1, "sized"))
        goto done;
    if (with_levels && (take(o_level, &b[14], 8, R * S, 0, "level")
                        || take(o_backed, &b[15], 8, R * S, 0, "backed")))
        goto done;
    const int64_t *grid = b[0].view.buf, *previous = b[2].view.buf, *base = b[3].view.buf;
    const int64_t *restart = b[4].view.buf, *rooms = b[5].view.buf;
    const int64_t *num_tokens = b[6].view.buf;
    const int64_t *level = with_levels ? b[14].view.buf : NULL;
    const int64_t *backed = with_levels ? b[15].view.buf : NULL;
    const double *costs = b[8].view.buf, *batch_costs = b[9].view.buf;
    int64_t *sizes = b[1].view.buf, *cells = b[10].view.buf, *best = b[12].view.buf;
    int64_t *sized = b[13].view.buf;
    double *values = b[11].view.buf;
    Py_ssize_t table = b[7].view.len / 16;  /* cells in the table: trials, then accepted */
    const double *trials = b[7].view.buf, *accepted = trials + table;
    items = malloc(sizeof(Item) * (size_t)(R * K + 1));
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t num_items = 0;
    for (Py_ssize_t r = 0; r < R; r++) {
        const int64_t *g = grid + r * S * K;
        int64_t *c = cells + r * S * K;
        /* each token's cell: its slot and column, how many other candidates agree, its
         * backing level, the request's outcome cell (TokenAcceptance.grid_cells) */
        for (Py_ssize_t s = 0; s < S; s++) {
            int64_t lv = with_levels ? level[r * S + s] : 0;
            int64_t bk = with_levels ? backed[r * S + s] : 0;
            for (Py_ssize_t k = 0; k < K; k++) {
                int64_t token = g[s * K + k], same = 0;
                for (Py_ssize_t o = 0; o < S; o++)
                    same += g[o * K + k] == token;
                int64_t vote = same - 1 < max_votes ? same - 1 : max_votes;
                int64_t cell = base[s * K + k] + vote * vote_unit + previous[r];
                if (with_levels)
                    cell += (k < bk ? lv : 0) * num_previous;
                c[s * K + k] = cell;
            }
        }
        if (sizes[r * S + tail] == 0) {  /* no tail: a restart block, valued as the tail */
            memcpy(c + tail * K, restart, sizeof(int64_t) * (size_t)K);
            sizes[r * S + tail] = num_tokens[r] > 0 ? rooms[r] : 0;
        }
        /* values: the running product of the cells' rates (TokenAcceptance.grid_values);
         * each candidate's best rate over its prefixes (best_candidates) */
        double *v = values + r * S * K;
        Py_ssize_t chosen = 0;
        double top = -INFINITY;
        for (Py_ssize_t s = 0; s < S; s++) {
            double product = 1.0, sum = 0.0, most = -INFINITY;
            int64_t length = sizes[r * S + s];
            for (Py_ssize_t k = 0; k < K; k++) {
                int64_t cell = c[s * K + k];
                double x = accepted[cell] / trials[cell];
                product = k ? product * x : x;
                v[s * K + k] = product;
                sum = k ? sum + product : product;
                if (k < length) {
                    double here = (1 + sum / margin1) / costs[k];
                    if (here > most) most = here;
                }
            }
            if (most > top) {
                top = most;
                chosen = s;
            }
        }
        best[r] = top > plain ? chosen : -1;
        sized[r] = 0;
        if (best[r] < 0)
            continue;
        /* the chosen candidate's positions up to its cap, if its first is worth anything */
        Py_ssize_t s = best[r];
        int64_t cap = sizes[r * S + s] < rooms[r] ? sizes[r * S + s] : rooms[r];
        if (!(v[s * K] > 0))
            cap = 0;
        for (Py_ssize_t k = 0; k < cap && k < K; k++) {
            items[num_items].value = v[s * K + k];
            items[num_items].row = r;
            items[num_items].pos = k;
            num_items++;
        }
    }
    /* the batch's sizing (cost_model.draft_lengths_grid): positions best first while each
     * raises the step's expected tokens per cost */
    qsort(items, (size_t)num_items, sizeof(Item), by_value);
    double gain = (double)batch;
    Py_ssize_t taken = 0;
    double rate_now = gain / batch_costs[0];
    for (; taken < num_items; taken++) {
        double more = gain + items[taken].value * trust;
        double rate_more = more / batch_costs[taken + 1];
        if (rate_more <= rate_now)
            break;
        gain = more;
        rate_now = rate_more;
    }
    for (Py_ssize_t m = 0; m < taken; m++)
        sized[items[m].row] += 1;
    result = Py_BuildValue("(dd)", gain, batch_costs[taken]);
done:
    free(items);
    release(b, 16);
    return result;
}

/* How many leading tokens of a candidate `g` (K wide, -1 past it) the committed tokens `kn`
 * (-2 past them, `num_known` long) reveal: up to and including its first miss; `*hits` of
 * them accepted. */
static Py_ssize_t revealed(const int64_t *g, const int64_t *kn, Py_ssize_t K,
                           int64_t num_known, Py_ssize_t *hits) {
    Py_ssize_t length = 0, h = 0;
    while (length < K && g[length] >= 0) length++;
    while (h < K && g[h] == kn[h]) h++;
    *hits = h;
    return h + (h < (length < num_known ? length : num_known));
}

/* count(counts, cells, grid, known, num_known, R, S, K, halve_at)
 *
 * TokenAcceptance.observe_grid: for each request in order, each candidate's tokens up to and
 * including its first miss (as far as the committed tokens `known` [R, K], -2 past them and
 * `num_known` [R] long, reveal) add one trial to their cells, the accepted ones one acceptance;
 * after each request the cells whose trials passed `halve_at` are halved. */
static PyObject *count(PyObject *self, PyObject *args) {
    PyObject *o_counts, *o_cells, *o_grid, *o_known, *o_num_known;
    Py_ssize_t R, S, K;
    double halve_at;
    if (!PyArg_ParseTuple(args, "OOOOOnnnd", &o_counts, &o_cells, &o_grid, &o_known,
                          &o_num_known, &R, &S, &K, &halve_at))
        return NULL;
    Buf b[5] = {{{0}}};
    PyObject *result = NULL;
    if (take(o_counts, &b[0], 8, 0, 1, "counts") || take(o_cells, &b[1], 8, R * S * K, 0, "cells")
        || take(o_grid, &b[2], 8, R * S * K, 0, "grid") || take(o_known, &b[3], 8, R * K, 0, "known")
        || take(o_num_known, &b[4], 8, R, 0, "num_known"))
        goto done;
    Py_ssize_t table = b[0].view.len / 16;
    double *trials = b[0].view.buf, *accepted = trials + table;
    const int64_t *cells = b[1].view.buf, *grid = b[2].view.buf, *known = b[3].view.buf;
    const int64_t *num_known = b[4].view.buf;
    for (Py_ssize_t r = 0; r < R; r++) {
        const int64_t *kn = known + r * K;
        for (Py_ssize_t s = 0; s < S; s++) {
            const int64_t *c = cells + (r * S + s) * K;
            Py_ssize_t hits, seen = revealed(grid + (r * S + s) * K, kn, K, num_known[r], &hits);
            for (Py_ssize_t k = 0; k < seen; k++) {
                if (c[k] < 0 || c[k] >= table) {
                    PyErr_SetString(PyExc_IndexError, "count: a cell outside the table");
                    goto done;
                }
                trials[c[k]] += 1.0;
                if (k < hits) accepted[c[k]] += 1.0;
            }
        }
        for (Py_ssize_t s = 0; s < S; s++) {  /* the cells this request counted */
            const int64_t *c = cells + (r * S + s) * K;
            Py_ssize_t hits, seen = revealed(grid + (r * S + s) * K, kn, K, num_known[r], &hits);
            for (Py_ssize_t k = 0; k < seen; k++) {
                if (trials[c[k]] > halve_at) {  /* halved once: back below halve_at */
                    trials[c[k]] /= 2;
                    accepted[c[k]] /= 2;
                }
            }
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    release(b, 5);
    return result;
}

static PyMethodDef methods[] = {
    {"choose", choose, METH_VARARGS, "Value, choose and size a step's candidate grid."},
    {"count", count, METH_VARARGS, "Count last step's candidates against the committed tokens."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_grid_native",
                                    "The adaptive policy's whole-step arithmetic in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__grid_native(void) { return PyModule_Create(&module); }
