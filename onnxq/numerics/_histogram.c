/* onnxq._histogram: the histogram update of onnxq.tensor_stats.TensorStats, compiled.
 *
 * count(x, rows, stride, scale, half, counts) adds to the int64 histogram `counts` the bin
 * floor(v * scale) + half of every `stride`-th value v of each of the `rows` samples of the
 * C-contiguous float32 buffer `x` (positions 0, stride, 2*stride, ... of each sample).  It is
 * the same arithmetic as the numpy path (TensorStats._add_values), so both give identical
 * counts: `scale` is a power of two, and v * scale is exact in double precision for every
 * float32 v.  A value whose bin falls outside `counts` (the caller grows the range first, so
 * only a NaN can) stops the update with ValueError and leaves `counts` unchanged.
 *
 * Why compiled: numpy needs a strided gather, a scaling pass and np.bincount, about 2.9 ns per
 * counted value on the reference machine; this loop reads the sampled values in place and
 * counts them into four interleaved sub-histograms (consecutive values often share a bin,
 * which serialises a single histogram's increments), about 1.3 ns, with the GIL released so
 * onnxruntime runs the next batch meanwhile.  The package works without it (numpy path).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SUB 4                      /* interleaved sub-histograms */
#define FLUSH ((int64_t)1 << 30)   /* values per sub-histogram pass: uint32 counts cannot wrap */

static inline int64_t floor_i64(double v)
{
    int64_t t = (int64_t)v;
    return t - (v < (double)t);
}

/* Add the sub-histograms to counts and zero them. */
static void flush(uint32_t *sub, int64_t bins, int64_t *counts)
{
    for (int q = 0; q < SUB; q++)
        for (int64_t b = 0; b < bins; b++)
            counts[b] += sub[q * bins + b];
    memset(sub, 0, (size_t)(SUB * bins) * sizeof(uint32_t));
}

/* Count one pass; returns 0, or -1 when a bin is out of range. */
static int count_pass(const float *x, int64_t rows, int64_t length, int64_t stride,
                      double scale, int64_t half, int64_t bins, uint32_t *sub,
                      int64_t *counts)
{
    int64_t since = 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *s = x + i * length;
        int64_t j = 0;
        for (; j + 3 * stride < length; j += 4 * stride) {
            int64_t b0 = floor_i64((double)s[j] * scale) + half;
            int64_t b1 = floor_i64((double)s[j + stride] * scale) + half;
            int64_t b2 = floor_i64((double)s[j + 2 * stride] * scale) + half;
            int64_t b3 = floor_i64((double)s[j + 3 * stride] * scale) + half;
            if ((uint64_t)b0 >= (uint64_t)bins || (uint64_t)b1 >= (uint64_t)bins
                || (uint64_t)b2 >= (uint64_t)bins || (uint64_t)b3 >= (uint64_t)bins)
                return -1;
            sub[b0]++;
            sub[bins + b1]++;
            sub[2 * bins + b2]++;
            sub[3 * bins + b3]++;
        }
        for (; j < length; j += stride) {
            int64_t b = floor_i64((double)s[j] * scale) + half;
            if ((uint64_t)b >= (uint64_t)bins)
                return -1;
            sub[b]++;
        }
        since += length / stride + 1;
        if (since >= FLUSH) {
            flush(sub, bins, counts);
            since = 0;
        }
    }
    flush(sub, bins, counts);
    return 0;
}

static int is_format(const Py_buffer *b, const char *codes, Py_ssize_t itemsize)
{
    return b->itemsize == itemsize && b->format != NULL && b->format[0] != '\0'
        && b->format[1] == '\0' && strchr(codes, b->format[0]) != NULL;
}

static PyObject *count(PyObject *self, PyObject *args)
{
    PyObject *xo, *co;
    Py_ssize_t rows, stride, half;
    double scale;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnndnO", &xo, &rows, &stride, &scale, &half, &co))
        return NULL;
    Py_buffer xb, cb;
    if (PyObject_GetBuffer(xo, &xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(co, &cb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t n = (int64_t)(xb.len / 4), bins = (int64_t)(cb.len / 8);
    if (!is_format(&xb, "f", 4) || !is_format(&cb, "lq", 8)) {
        PyErr_SetString(PyExc_TypeError, "count() takes float32 values and int64 counts");
    } else if (rows <= 0 || stride <= 0 || n % rows != 0 || bins <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "count(): rows and stride must be positive, rows must divide the values");
    } else {
        uint32_t *sub = calloc((size_t)(SUB * bins), sizeof(uint32_t));
        int64_t *fresh = calloc((size_t)bins, sizeof(int64_t));
        if (sub == NULL || fresh == NULL) {
            PyErr_NoMemory();
        } else {
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = count_pass((const float *)xb.buf, rows, n / rows, stride, scale, half,
                                bins, sub, fresh);
            Py_END_ALLOW_THREADS
            if (status < 0) {
                PyErr_SetString(PyExc_ValueError,
                                "count(): a value falls outside the histogram (NaN, or a range "
                                "not grown first); nothing was counted");
            } else {
                int64_t *out = (int64_t *)cb.buf;
                for (int64_t b = 0; b < bins; b++)
                    out[b] += fresh[b];
                result = Py_None;
                Py_INCREF(result);
            }
        }
        free(sub);
        free(fresh);
    }
    PyBuffer_Release(&cb);
    PyBuffer_Release(&xb);
    return result;
}

static PyMethodDef methods[] = {
    {"count", count, METH_VARARGS,
     "count(x, rows, stride, scale, half, counts): add floor(v * scale) + half of every\n"
     "stride-th value v of each of the rows samples of float32 x to int64 counts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "onnxq._histogram",
    "Compiled histogram update for onnxq.tensor_stats (optional; numpy is the fallback).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__histogram(void)
{
    return PyModule_Create(&module);
}
