/* A verify step's token rows written into the drafting grids in C: lists of tokens (what
 * vLLM committed, what a lookup returned) and the Jacobi tails, each a loop over the step's
 * requests that numpy can only do through index arrays (vllm_cllm/core/step.py's
 * committed_grid and tails_into, vllm_cllm/sources/suffix_trees.py's propose_into).
 * tests/test_native.py compares each with its numpy path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A 2-D int64 grid with any strides. */
static inline int64_t *cell(Py_buffer *grid, Py_ssize_t j, Py_ssize_t k) {
    return (int64_t *)((char *)grid->buf + j * grid->strides[0] + k * grid->strides[1]);
}

static int grid_buffer(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    if (view->ndim != 2 || view->itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "%s must be a 2-D int64 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A 1-D int64 array of at least `count` items (contiguous). */
static int vector_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t count, int writable,
                         const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != 8 || view->len < count * 8) {
        PyErr_Format(PyExc_ValueError, "%s must be int64 with at least %zd items", name, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* lists_into(into, lists, rows, counts)
 *
 * into [R, K] int64 (any strides, already filled with the "no token" value); lists a list of
 * sequences of ints (lists: no copy); rows a list of R indices into `lists` (None:
 * lists[0..R)). Writes the first K tokens of entry rows[j] into into[j] and its whole length
 * into counts [R] (int64). */
static PyObject *lists_into(PyObject *self, PyObject *args) {
    PyObject *o_into, *lists, *rows, *o_counts;
    if (!PyArg_ParseTuple(args, "OO!OO", &o_into, &PyList_Type, &lists, &rows, &o_counts))
        return NULL;
    if (rows != Py_None && !PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "lists_into: rows must be a list or None");
        return NULL;
    }
    Py_ssize_t R = rows == Py_None ? PyList_GET_SIZE(lists) : PyList_GET_SIZE(rows);
    Py_buffer into, counts;
    if (grid_buffer(o_into, &into, "lists_into: into") < 0)
        return NULL;
    if (vector_buffer(o_counts, &counts, R, 1, "lists_into: counts") < 0) {
        PyBuffer_Release(&into);
        return NULL;
    }
    PyObject *result = NULL;
    if (into.shape[0] < R) {
        PyErr_SetString(PyExc_ValueError, "lists_into: fewer grid rows than lists");
        goto done;
    }
    Py_ssize_t width = into.shape[1], num_lists = PyList_GET_SIZE(lists);
    int64_t *count = counts.buf;
    for (Py_ssize_t j = 0; j < R; j++) {
        Py_ssize_t i = j;
        if (rows != Py_None) {
            i = PyLong_AsSsize_t(PyList_GET_ITEM(rows, j));
            if (i == -1 && PyErr_Occurred()) goto done;
        }
        if (i < 0 || i >= num_lists) {
            PyErr_SetString(PyExc_IndexError, "lists_into: a row outside lists");
            goto done;
        }
        PyObject *tokens = PySequence_Fast(PyList_GET_ITEM(lists, i),
                                           "lists_into: each entry must be a sequence of ints");
        if (!tokens) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
        for (Py_ssize_t k = 0; k < n && k < width; k++) {
            long long token = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(tokens, k));
            if (token == -1 && PyErr_Occurred()) {
                Py_DECREF(tokens);
                goto done;
            }
            *cell(&into, j, k) = token;
        }
        Py_DECREF(tokens);
        count[j] = n;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&into);
    PyBuffer_Release(&counts);
    return result;
}

/* tails_into(into, flat, offsets, num_committed, lengths, rows, accepted, next_draft,
 *            next_len, sizes)
 *
 * The Jacobi tail of each request of a step without mask slots (VerifyStep.tails_into):
 * request rows[j] (None: j) committed num_committed[i] tokens; its predictions are
 * flat[offsets[i]:offsets[i + 1]]. Its tail is the device's block next_draft[i, :next_len[i]]
 * where the device step accepted exactly what vLLM committed (accepted[i] ==
 * num_committed[i] - 1; accepted None: never), else the predictions behind the committed
 * ones; cut to lengths[j], written into into[j] (int64, any strides) and its length into
 * sizes[j]. Every array int64. */
static PyObject *tails_into(PyObject *self, PyObject *args) {
    PyObject *objs[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &objs[7], &objs[8], &objs[9]))
        return NULL;
    Py_buffer b[10];
    int held[10] = {0};
    PyObject *result = NULL;
    if (grid_buffer(objs[0], &b[0], "tails_into: into") < 0)
        return NULL;
    held[0] = 1;
    Py_ssize_t R = b[0].shape[0];
    if ((objs[6] == Py_None) != (objs[7] == Py_None) || (objs[7] == Py_None) != (objs[8] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "tails_into: accepted, next_draft and next_len go "
                                          "together");
        goto done;
    }
    if (objs[7] != Py_None) {
        if (grid_buffer(objs[7], &b[7], "tails_into: next_draft") < 0) goto done;
        held[7] = 1;
    }
    /* the step's requests: their number is what offsets and num_committed tell */
    static const char *names[10] = {"into", "flat", "offsets", "num_committed", "lengths",
                                    "rows", "accepted", "", "next_len", "sizes"};
    for (int i = 1; i < 10; i++) {  /* rows, accepted and next_len may be None */
        if (i == 7 || ((i == 5 || i == 6 || i == 8) && objs[i] == Py_None)) continue;
        Py_ssize_t need = (i == 4 || i == 5 || i == 9) ? R : 0;
        if (vector_buffer(objs[i], &b[i], need, i == 9, names[i]) < 0) goto done;
        held[i] = 1;
    }
    Py_ssize_t batch = b[3].len / 8, num_flat = b[1].len / 8;
    if (b[2].len / 8 < batch + 1 || (held[6] && (b[6].len / 8 < batch || b[8].len / 8 < batch
                                                  || b[7].shape[0] < batch))) {
        PyErr_SetString(PyExc_ValueError, "tails_into: offsets, accepted, next_draft and "
                                          "next_len must cover every request");
        goto done;
    }
    const int64_t *flat = b[1].buf, *offsets = b[2].buf, *committed = b[3].buf,
                  *lengths = b[4].buf, *rows = held[5] ? b[5].buf : NULL,
                  *accepted = held[6] ? b[6].buf : NULL, *next_len = held[8] ? b[8].buf : NULL;
    int64_t *sizes = b[9].buf;
    Py_ssize_t width = b[0].shape[1];
    for (Py_ssize_t j = 0; j < R; j++) {
        int64_t i = rows ? rows[j] : j;
        if (i < 0 || i >= batch) {
            PyErr_SetString(PyExc_IndexError, "tails_into: a row outside the step");
            goto done;
        }
        int64_t sampled = committed[i], room = lengths[j], n;
        if (accepted && accepted[i] == sampled - 1) {  /* the device's block */
            n = next_len[i] < room ? next_len[i] : room;
            if (n < 0) n = 0;
            if (n > width || n > b[7].shape[1]) goto too_wide;
            for (int64_t k = 0; k < n; k++)
                *cell(&b[0], j, k) = *(int64_t *)((char *)b[7].buf + i * b[7].strides[0]
                                                  + k * b[7].strides[1]);
        } else {  /* the predictions behind the committed tokens, as far as the row goes */
            int64_t begin = offsets[i], end = offsets[i + 1], size = end - begin;
            int64_t start = begin + (sampled < size ? sampled : size);
            n = end - start < room ? end - start : room;
            if (n < 0) n = 0;
            if (start < 0 || start + n > num_flat) {
                PyErr_SetString(PyExc_IndexError, "tails_into: a tail outside flat");
                goto done;
            }
            if (n > width) goto too_wide;
            for (int64_t k = 0; k < n; k++) *cell(&b[0], j, k) = flat[start + k];
        }
        sizes[j] = n;
    }
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
too_wide:
    PyErr_SetString(PyExc_ValueError, "tails_into: a tail wider than the grid");
done:
    for (int i = 0; i < 10; i++)
        if (held[i]) PyBuffer_Release(&b[i]);
    return result;
}

/* step_arrays(committed, num_tokens, max_draft, max_model_len, out)
 *
 * A step's per-request arrays from what vLLM hands a proposer (VerifyStep.from_vllm):
 * committed a list of B sequences (this step's tokens of each request), num_tokens a 1-D
 * int32 or int64 array of at least B entries (each request's committed tokens so far), out
 * [3, B] int64 (C order): out[0] num_tokens as int64, out[1] how many tokens each request
 * committed, out[2] its room: min(max_model_len - num_tokens, max_draft), at least 0, and 0
 * where it committed nothing (a partial prefill). Returns the list of requests with room. */
static PyObject *step_arrays(PyObject *self, PyObject *args) {
    PyObject *committed, *o_num, *o_out;
    long long max_draft, max_model_len;
    if (!PyArg_ParseTuple(args, "O!OLLO", &PyList_Type, &committed, &o_num, &max_draft,
                          &max_model_len, &o_out))
        return NULL;
    Py_ssize_t B = PyList_GET_SIZE(committed);
    Py_buffer num, out;
    if (PyObject_GetBuffer(o_num, &num, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return NULL;
    if (num.ndim != 1 || (num.itemsize != 4 && num.itemsize != 8) || num.shape[0] < B
            || strchr("ilq", num.format[num.format[0] == '<' || num.format[0] == '=' ? 1 : 0])
               == NULL) {
        PyErr_SetString(PyExc_ValueError, "step_arrays: num_tokens must be a 1-D int32 or "
                                          "int64 array covering every request");
        PyBuffer_Release(&num);
        return NULL;
    }
    if (vector_buffer(o_out, &out, 3 * B, 1, "step_arrays: out") < 0) {
        PyBuffer_Release(&num);
        return NULL;
    }
    PyObject *drafting = PyList_New(0);
    if (!drafting) goto fail;
    int64_t *lengths = out.buf, *counts = lengths + B, *rooms = lengths + 2 * B;
    for (Py_ssize_t i = 0; i < B; i++) {
        const char *at = (const char *)num.buf + i * num.strides[0];
        int64_t length = num.itemsize == 4 ? *(const int32_t *)at : *(const int64_t *)at;
        PyObject *tokens = PyList_GET_ITEM(committed, i);
        Py_ssize_t n = PyList_Check(tokens) ? PyList_GET_SIZE(tokens) : PyObject_Length(tokens);
        if (n < 0) goto fail;
        int64_t room = max_model_len - length;
        if (room > max_draft) room = max_draft;
        if (room < 0 || n == 0) room = 0;
        lengths[i] = length;
        counts[i] = n;
        rooms[i] = room;
        if (room > 0) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (!index || PyList_Append(drafting, index) < 0) {
                Py_XDECREF(index);
                goto fail;
            }
            Py_DECREF(index);
        }
    }
    PyBuffer_Release(&num);
    PyBuffer_Release(&out);
    return drafting;
fail:
    Py_XDECREF(drafting);
    PyBuffer_Release(&num);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"step_arrays", step_arrays, METH_VARARGS, "A step's per-request arrays and drafting rows."},
    {"lists_into", lists_into, METH_VARARGS, "Lists of tokens, into a grid's rows."},
    {"tails_into", tails_into, METH_VARARGS, "A step's Jacobi tails, into a grid's rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tokens_native",
                                    "A verify step's token rows, into grids, in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__tokens_native(void) { return PyModule_Create(&module); }
