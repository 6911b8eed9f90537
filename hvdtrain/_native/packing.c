/* hvdtrain._packing: copy float32 gradients into one buffer and sum their squares in
 * the same pass, so the non-finite check's bound costs no second read of the buffer
 * (hvdtrain/adapters/torch/tally.py uses it when it is built, torch.dot otherwise). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LANES 16 /* independent partial sums: lets the compiler vectorise the loop */

static float copy_and_square_sum(const float *source, float *target, Py_ssize_t count) {
    float partial[LANES] = {0};
    Py_ssize_t i = 0;
    for (; i + LANES <= count; i += LANES) {
        for (int lane = 0; lane < LANES; ++lane) {
            float value = source[i + lane];
            target[i + lane] = value;
            partial[lane] += value * value;
        }
    }
    float total = 0;
    for (; i < count; ++i) {
        target[i] = source[i];
        total += source[i] * source[i];
    }
    for (int lane = 0; lane < LANES; ++lane) total += partial[lane];
    return total;
}

static PyObject *pack_float32(PyObject *self, PyObject *args) {
    PyObject *addresses, *counts;
    unsigned long long target_address;
    if (!PyArg_ParseTuple(args, "O!O!K", &PyTuple_Type, &addresses, &PyTuple_Type, &counts,
                          &target_address))
        return NULL;
    Py_ssize_t tensors = PyTuple_GET_SIZE(addresses);
    if (PyTuple_GET_SIZE(counts) != tensors) {
        PyErr_SetString(PyExc_ValueError, "addresses and counts differ in length");
        return NULL;
    }
    const float **sources = PyMem_Malloc(sizeof(float *) * (tensors ? tensors : 1));
    Py_ssize_t *sizes = PyMem_Malloc(sizeof(Py_ssize_t) * (tensors ? tensors : 1));
    if (sources == NULL || sizes == NULL) {
        PyMem_Free(sources);
        PyMem_Free(sizes);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t t = 0; t < tensors; ++t) {
        sources[t] = (const float *)(uintptr_t)PyLong_AsUnsignedLongLong(
            PyTuple_GET_ITEM(addresses, t));
        sizes[t] = PyLong_AsSsize_t(PyTuple_GET_ITEM(counts, t));
    }
    if (PyErr_Occurred()) {
        PyMem_Free(sources);
        PyMem_Free(sizes);
        return NULL;
    }
    float *target = (float *)(uintptr_t)target_address;
    double square_sum = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < tensors; ++t) {
        square_sum += copy_and_square_sum(sources[t], target, sizes[t]);
        target += sizes[t];
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(sources);
    PyMem_Free(sizes);
    return PyFloat_FromDouble(square_sum);
}

static PyMethodDef methods[] = {
    {"pack_float32", pack_float32, METH_VARARGS,
     "pack_float32(addresses, counts, target) -> float\n\n"
     "Copy each float32 array (address, element count) into the float32 buffer at\n"
     "target, one after another, and return the sum of the squares of what was copied\n"
     "(NaN if any is NaN, inf if any is infinite or the float32 sums overflow)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_packing",
                                    "Fused copy and square sum for the torch adapter.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__packing(void) { return PyModule_Create(&module); }
