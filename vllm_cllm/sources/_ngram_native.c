/* The request n-gram lookup of a whole step in C: for each request, where the usual and the
 * latest continuation of its longest suffix n-gram begin in its tokens (what
 * vllm_cllm/sources/ngram.py's ngram_starts finds), written straight into the candidate grid.
 * tests/test_ngram_native.py compares it with the Python search.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* A request's tokens in vLLM's token buffer: int32 (vLLM) or int64 items. */
typedef struct {
    const char *base;
    Py_ssize_t itemsize;
} Tokens;

static inline int64_t at(const Tokens *t, Py_ssize_t i) {
    return t->itemsize == 4 ? ((const int32_t *)t->base)[i] : ((const int64_t *)t->base)[i];
}

static int by_token(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* How many entries of sorted[0..n) equal `value`. */
static Py_ssize_t occurrences(const int64_t *sorted, Py_ssize_t n, int64_t value) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (sorted[mid] < value) lo = mid + 1; else hi = mid;
    }
    Py_ssize_t first = lo;
    hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (sorted[mid] <= value) lo = mid + 1; else hi = mid;
    }
    return lo - first;
}

/* The ends e (n - 1 <= e <= length - 2, ascending) of the occurrences of the last n tokens
 * of p[0..length) that a token follows, into ends; how many. One function per item type, so
 * that the scan reads the buffer without a per-token branch on its width. */
#define OCCURRENCE_ENDS(NAME, T)                                                           \
    static Py_ssize_t NAME(const T *p, Py_ssize_t length, Py_ssize_t n, int64_t *ends) {     \
        const T last = p[length - 1];                                                      \
        Py_ssize_t count = 0;                                                              \
        for (Py_ssize_t e = n - 1; e <= length - 2; e++) {                                 \
            if (p[e] != last) continue;                                                    \
            Py_ssize_t j = 1;                                                              \
            while (j < n && p[e - j] == p[length - 1 - j]) j++;                            \
            if (j == n) ends[count++] = e;                                                 \
        }                                                                                  \
        return count;                                                                      \
    }
OCCURRENCE_ENDS(occurrence_ends_i32, int32_t)
OCCURRENCE_ENDS(occurrence_ends_i64, int64_t)

/* ngram_starts over `length` tokens: 1 and the usual and latest starts, 0 where no suffix
 * n-gram occurred earlier, -1 when out of memory. `ends` has room for `length` entries. */
static int starts(const Tokens *t, Py_ssize_t length, Py_ssize_t ngram_min,
                  Py_ssize_t ngram_max, int64_t *ends, Py_ssize_t *usual, Py_ssize_t *latest) {
    Py_ssize_t top = ngram_max < length - 1 ? ngram_max : length - 1;
    if (top < (ngram_min > 1 ? ngram_min : 1))
        return 0;
    Py_ssize_t n = ngram_min;
    /* every earlier occurrence of the last n tokens that a token follows, in order of its
     * end: a scan for the last token, each match checked backwards (the hot loop of a step) */
    Py_ssize_t num_ends = t->itemsize == 4
        ? occurrence_ends_i32((const int32_t *)t->base, length, n, ends)
        : occurrence_ends_i64((const int64_t *)t->base, length, n, ends);
    if (!num_ends)
        return 0;
    Py_ssize_t num_hits = num_ends;
    if (num_ends > 1 && top > n) {
        /* extend each backwards up to top tokens; keep those that go furthest */
        Py_ssize_t best = 0;
        num_hits = 0;
        for (Py_ssize_t e = 0; e < num_ends; e++) {
            int64_t end = ends[e];
            Py_ssize_t run = n;
            for (Py_ssize_t back = n; back < top; back++) {
                if (end < run || at(t, end - run) != at(t, length - 1 - back)) break;
                run++;
            }
            if (run > best) {
                best = run;
                num_hits = 0;
            }
            if (run == best) ends[num_hits++] = end;
        }
    }
    if (num_hits == 1) {
        *usual = *latest = ends[0] + 1;
        return 1;
    }
    /* the first hit whose next token followed the n-gram most often */
    int64_t *follows = malloc(sizeof(int64_t) * (size_t)num_hits);
    if (!follows)
        return -1;
    for (Py_ssize_t h = 0; h < num_hits; h++) follows[h] = at(t, ends[h] + 1);
    qsort(follows, (size_t)num_hits, sizeof(int64_t), by_token);
    Py_ssize_t most = 0;
    for (Py_ssize_t h = 0; h < num_hits;) {
        Py_ssize_t g = h;
        while (g < num_hits && follows[g] == follows[h]) g++;
        if (g - h > most) most = g - h;
        h = g;
    }
    *usual = ends[0] + 1;
    for (Py_ssize_t h = 0; h < num_hits; h++) {
        if (occurrences(follows, num_hits, at(t, ends[h] + 1)) == most) {
            *usual = ends[h] + 1;
            break;
        }
    }
    *latest = ends[num_hits - 1] + 1;
    free(follows);
    return 1;
}

/* Write row j's continuation: into[j, :size] = tokens[start:start + size]. */
static void write_row(Py_buffer *into, Py_ssize_t j, const Tokens *t, Py_ssize_t start,
                      Py_ssize_t size) {
    char *row = (char *)into->buf + j * into->strides[0];
    for (Py_ssize_t k = 0; k < size; k++)
        *(int64_t *)(row + k * into->strides[1]) = at(t, start + k);
}

/* spans(token_ids, rows, ends, lengths, ngram_min, ngram_max, max_model_len, usual, latest,
 *       usual_sizes, latest_sizes)
 *
 * token_ids [B, max_model_len] (int32 or int64); rows [R] the requests' rows in it (None:
 * 0..R-1); ends [R] their token counts; lengths [R] the most tokens each may take. Writes each
 * request's usual continuation into usual [R, K] (int64, any strides, already -1) and its
 * length into usual_sizes [R], and the latest one into latest / latest_sizes (each pair None
 * where not asked for), as RequestNgrams.propose_into does. */
static PyObject *spans(PyObject *self, PyObject *args) {
    PyObject *o_tokens, *o_rows, *o_ends, *o_lengths, *o_usual, *o_latest, *o_usual_sizes,
        *o_latest_sizes;
    Py_ssize_t ngram_min, ngram_max, max_model_len;
    if (!PyArg_ParseTuple(args, "OOOOnnnOOOO", &o_tokens, &o_rows, &o_ends, &o_lengths,
                          &ngram_min, &ngram_max, &max_model_len, &o_usual, &o_latest,
                          &o_usual_sizes, &o_latest_sizes))
        return NULL;
    Py_buffer b[8];
    int held[8] = {0};
    PyObject *objs[8] = {o_tokens, o_rows, o_ends, o_lengths, o_usual, o_latest,
                         o_usual_sizes, o_latest_sizes};
    int flags[8] = {PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT,
                    PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT,
                    PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE,
                    PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE,
                    PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE,
                    PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE};
    PyObject *result = NULL;
    int64_t *ends_buf = NULL;
    for (int i = 0; i < 8; i++) {
        if (objs[i] == Py_None) continue;
        if (PyObject_GetBuffer(objs[i], &b[i], flags[i]) < 0) goto done;
        held[i] = 1;
    }
    if (!held[0] || !held[2] || !held[3] || held[4] != held[6] || held[5] != held[7]) {
        PyErr_SetString(PyExc_ValueError, "spans: token_ids, ends and lengths are required, "
                                          "each grid with its sizes");
        goto done;
    }
    if (b[0].ndim != 2 || (b[0].itemsize != 4 && b[0].itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "spans: token_ids must be [B, L] int32 or int64");
        goto done;
    }
    Py_ssize_t R = b[2].len / 8, width = b[0].shape[1];
    for (int i = 4; i < 6; i++) {
        if (held[i] && (b[i].ndim != 2 || b[i].itemsize != 8 || b[i].shape[0] < R)) {
            PyErr_SetString(PyExc_ValueError, "spans: usual / latest must be [R, K] int64");
            goto done;
        }
    }
    if ((held[1] && (b[1].len < R * 8 || b[1].itemsize != 8)) || b[3].len < R * 8
        || b[2].itemsize != 8 || b[3].itemsize != 8
        || (held[6] && (b[6].len < R * 8 || b[6].itemsize != 8))
        || (held[7] && (b[7].len < R * 8 || b[7].itemsize != 8))) {
        PyErr_SetString(PyExc_ValueError, "spans: rows, lengths and sizes must be [R] int64");
        goto done;
    }
    const int64_t *rows = held[1] ? b[1].buf : NULL, *ends = b[2].buf, *lengths = b[3].buf;
    int64_t *usual_sizes = held[6] ? b[6].buf : NULL;
    int64_t *latest_sizes = held[7] ? b[7].buf : NULL;
    ends_buf = malloc(sizeof(int64_t) * (size_t)(width + 1));
    if (!ends_buf) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < R; j++) {
        Py_ssize_t row = rows ? rows[j] : j, end = ends[j], n = lengths[j];
        if (row < 0 || row >= b[0].shape[0] || end < 0) {
            PyErr_SetString(PyExc_IndexError, "spans: a request outside token_ids");
            goto done;
        }
        /* NgramFill.room: what fits before max_model_len, nothing for too short a context */
        n = end <= ngram_min ? 0 : (n < max_model_len - end ? n : max_model_len - end);
        Py_ssize_t usual = end, latest = end, found = 0;
        Tokens t = {(const char *)b[0].buf + row * width * b[0].itemsize, b[0].itemsize};
        if (n > 0) {
            /* (as a slice of the buffer: the tokens it holds) */
            found = starts(&t, end < width ? end : width, ngram_min, ngram_max, ends_buf,
                           &usual, &latest);
            if (found < 0) {
                PyErr_NoMemory();
                goto done;
            }
        }
        Py_ssize_t usual_size = found ? (n < end - usual ? n : end - usual) : 0;
        Py_ssize_t latest_size = found ? (n < end - latest ? n : end - latest) : 0;
        if ((held[4] && usual_size > b[4].shape[1])
            || (held[5] && latest_size > b[5].shape[1])) {
            PyErr_SetString(PyExc_ValueError, "spans: a continuation wider than the grid");
            goto done;
        }
        if ((held[4] && usual + usual_size > width) || (held[5] && latest + latest_size > width)) {
            PyErr_SetString(PyExc_IndexError, "spans: a continuation past token_ids");
            goto done;
        }
        if (held[4]) {
            usual_sizes[j] = usual_size;
            write_row(&b[4], j, &t, usual, usual_size);
        }
        if (held[5]) {
            latest_sizes[j] = latest_size;
            write_row(&b[5], j, &t, latest, latest_size);
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    free(ends_buf);
    for (int i = 0; i < 8; i++)
        if (held[i]) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"spans", spans, METH_VARARGS, "A step's request n-gram continuations, into the grid."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ngram_native",
                                    "The request n-gram lookup of a whole step in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__ngram_native(void) { return PyModule_Create(&module); }
