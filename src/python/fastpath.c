/* mrstack._fastpath: the Python package's hot path (Numba's memalloc and its finalizer,
 * CuPy's allocate and free) as a small CPython extension, because through ctypes each of
 * those foreign calls costs ~0.5-1 us of argument conversion and the budget for a
 * whole Numba allocate+free pair is 1.5 us. Everything else stays ctypes (mrstack/_lib.py),
 * and so does this path when the extension is missing: it is optional.
 *
 * Why it looks like this:
 * - It links neither libmrstack_c.so nor libpython. The C ABI's entry points arrive as
 *   addresses through bind(), taken from the library _lib.py loaded with ctypes, so the
 *   library is found in exactly one place and this module can never call into a second
 *   copy of it. The C ABI's header is included for its types only.
 * - The limited API of Python 3.10 (Py_LIMITED_API set by the build, file name
 *   _fastpath.abi3.so): one build loads on every CPython from 3.10 on (built here on 3.11,
 *   run on the GPU host's 3.12). 3.10 and not lower because METH_FASTCALL (arguments as a
 *   C array, no tuple built per call) joined the limited API in 3.10; under 3.9 the package
 *   keeps to ctypes. Vectorcall for our own types needs 3.12's limited API, so Finalizer is
 *   called through tp_call (for a call without arguments CPython passes the shared empty
 *   tuple: nothing is allocated).
 * - The GIL is released around every call into the library, as ctypes' CDLL does: a free
 *   may synchronize the device (cudaFree), and a pending Numba stream callback needs the
 *   GIL to finish.
 * - Failure raises nothing here: memalloc/allocate return None and the caller builds the
 *   exception from the C ABI's per-thread message and status, exactly as the ctypes path
 *   does, so both paths raise the same exception with the same text.
 * - A free the stack refuses (a Finalizer's, an Allocation's) cannot raise where it runs,
 *   at garbage collection: it calls the package's reporter (mrstack._lib.report_refused_free,
 *   given to bind()), which warns with the C ABI's message, as the ctypes path does.
 * - Arguments convert as ctypes converts them for the same C types, so the two paths agree
 *   on every input; but a size outside [0, 2**64 - 1] raises ValueError here, and a bool
 *   or a non-integer TypeError, as the Python side raises them before a ctypes call: cut
 *   to its low 64 bits, 2**64 + 8 would ask for 8 bytes while the caller's object (Numba's
 *   MemoryPointer) says 2**64 + 8, and True would ask for 1.
 *
 * It is C, not C++, and lives in src/python/ (not src/, whose *.cpp go into libmrstack,
 * nor python/mrstack/, which holds what pip copies verbatim): CMake builds it next to
 * libmrstack_c.so, and setup.py bundles both.
 */
#include <Python.h>

#include <stdint.h>

#include <mrstack/c_api.h>

#if !defined(Py_LIMITED_API) || Py_LIMITED_API + 0 < 0x030A0000
#error "mrstack._fastpath is built for the limited API of Python 3.10 (define Py_LIMITED_API=0x030A0000)"
#endif

typedef int (*c_api_version_fn)(void);
typedef mrstack_emm_allocation (*emm_memalloc_pair_fn)(mrstack_stack*, size_t, int);
typedef int (*emm_free_fn)(mrstack_stack*, uint64_t);
typedef mrstack_status (*allocate_fn)(mrstack_stack*, size_t, void*, int, void**);
typedef mrstack_status (*deallocate_fn)(mrstack_stack*, void*, size_t, void*, int);

/* The C ABI's entry points, set once by bind(). Process-wide like the library itself:
 * a second bind() with other addresses is refused, so no object made here can outlive
 * the functions it calls. */
static struct {
  emm_memalloc_pair_fn emm_memalloc_pair;
  emm_free_fn emm_free;
  allocate_fn allocate;
  deallocate_fn deallocate;
  unsigned long long addresses[5]; /* as bound, to tell a repeated bind() from a rebind */
  PyObject* report;                 /* report(client, ptr, size): a free was refused (a strong reference) */
} c_api;

static PyTypeObject* finalizer_type;
static PyTypeObject* allocation_type;

/* ---- argument conversion, as ctypes converts for the same C type -------------------- */

/* void*: an int (ctypes' c_void_p also takes None; the package never passes it here). */
static int stack_argument(PyObject* value, mrstack_stack** out) {
  void* p = PyLong_AsVoidPtr(value);
  if (p == NULL && PyErr_Occurred()) { return -1; }
  *out = (mrstack_stack*)p;
  return 0;
}

/* The TypeError for a size that is no integer, or a bool (an int to ctypes and to
 * PyNumber_Index: allocate(True) had asked for 1 byte), with mrstack._lib.checked_size's text. */
static void size_type_error(PyObject* value, char const* what) {
  PyObject* name = PyObject_GetAttrString((PyObject*)Py_TYPE(value), "__name__");
  if (name != NULL) {
    PyErr_Format(PyExc_TypeError, "%s(%R): the size must be an int, not %U", what, value, name);
    Py_DECREF(name);
  }
}

/* size_t: any integer but a bool (__index__ included) from 0 to 2**64 - 1; else TypeError
 * or ValueError, saying "<what>(<size>): ...", the texts mrstack._lib.checked_size raises
 * on the ctypes path. */
static int size_argument(PyObject* value, char const* what, size_t* out) {
  if (PyBool_Check(value)) {
    size_type_error(value, what);
    return -1;
  }
  PyObject* index = PyNumber_Index(value);
  if (index == NULL) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      size_type_error(value, what);
    }
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s(%R): the size is outside [0, 2**64 - 1]", what, value);
    }
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

/* int: ctypes' c_int keeps the low 32 bits too; the C ABI refuses an unknown client. */
static int int_argument(PyObject* value, int* out) {
  unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) { return -1; }
  *out = (int)(unsigned int)v;
  return 0;
}

/* void* that may be None (a stream: None or 0 is the legacy default stream). */
static int pointer_argument(PyObject* value, void** out) {
  if (value == Py_None) {
    *out = NULL;
    return 0;
  }
  void* p = PyLong_AsVoidPtr(value);
  if (p == NULL && PyErr_Occurred()) { return -1; }
  *out = p;
  return 0;
}

static int check_bound(void) {
  if (c_api.emm_free == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mrstack._fastpath: bind() was not called (mrstack._lib.fastpath() does it)");
    return -1;
  }
  return 0;
}

static int check_arguments(char const* name, Py_ssize_t given, Py_ssize_t wanted) {
  if (given != wanted) {
    PyErr_Format(PyExc_TypeError, "mrstack._fastpath.%s takes %zd arguments (%zd given)", name, wanted, given);
    return -1;
  }
  return 0;
}

/* Calls the reporter for a free of `ptr` (`size` bytes) the library just refused on this
 * thread, before anything else calls it: its last error is that free's. Returns what the
 * reporter returned, or NULL with its exception set (a warning filter of "error"). */
static PyObject* report_refused_free(int client, unsigned long long ptr, unsigned long long size) {
  return PyObject_CallFunction(c_api.report, "iKK", client, ptr, size);
}

/* PyType_Slot keeps every slot as a void*, functions included: ISO C leaves that conversion
 * undefined, POSIX (dlsym) and CPython rely on it. __extension__ tells -Wpedantic it is
 * meant, on these expressions only. */
#define SLOT_FUNCTION(fn) (__extension__(void*)(fn))

/* ---- Finalizer: frees one EMM token, exactly once ----------------------------------- */

typedef struct {
  PyObject_HEAD
  mrstack_stack* stack;
  uint64_t ptr;
  uint64_t token;
  uint64_t size; /* with the client, for the report of a refused free */
  int client;
  int pending;   /* 1 until the first call: later calls (and stale tokens) free nothing */
} finalizer_object;

static void finalizer_dealloc(PyObject* self) {
  /* Dropping a finalizer frees nothing: Numba calls it (weakref.finalize) when the
   * MemoryPointer dies, and reset() frees whatever was never finalized. */
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
}

/* finalizer() -> 1 when it freed (or queued, under defer_cleanup) the memory, 0 when it
 * did nothing (called before, or the token went stale at a reset), -1 when the library
 * refused: mrstack_emm_free's result, which is what the ctypes path's finalizer returns.
 * A refusal is reported first; should the report raise, so does the call (Numba runs it
 * from weakref.finalize, which hands the exception to sys.unraisablehook). */
static PyObject* finalizer_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (PyTuple_Size(args) != 0 || (kwargs != NULL && PyDict_Size(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "mrstack._fastpath.Finalizer takes no arguments");
    return NULL;
  }
  finalizer_object* f = (finalizer_object*)self;
  if (!f->pending) { return PyLong_FromLong(0); }
  /* Cleared while holding the GIL, before the call: a second caller (another thread
   * running while this one is inside the library) sees it done and frees nothing. */
  f->pending = 0;
  int freed;
  Py_BEGIN_ALLOW_THREADS
  freed = c_api.emm_free(f->stack, f->token);
  Py_END_ALLOW_THREADS
  if (freed < 0) {
    PyObject* reported = report_refused_free(f->client, f->ptr, f->size);
    if (reported == NULL) { return NULL; }
    Py_DECREF(reported);
  }
  return PyLong_FromLong(freed);
}

static PyObject* finalizer_repr(PyObject* self) {
  finalizer_object* f = (finalizer_object*)self;
  /* PyUnicode_FromFormat has no %llx, and its %p prints a null pointer as 0x(nil). */
  char text[128];
  PyOS_snprintf(text, sizeof text, "<mrstack._fastpath.Finalizer token=%llu ptr=%#llx %s>",
                (unsigned long long)f->token, (unsigned long long)f->ptr, f->pending ? "pending" : "done");
  return PyUnicode_FromString(text);
}

static PyObject* finalizer_get_ptr(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromUnsignedLongLong(((finalizer_object*)self)->ptr);
}

static PyObject* finalizer_get_token(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromUnsignedLongLong(((finalizer_object*)self)->token);
}

static PyObject* finalizer_get_stack(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromVoidPtr(((finalizer_object*)self)->stack);
}

static PyObject* finalizer_get_pending(PyObject* self, void* closure) {
  (void)closure;
  return PyBool_FromLong(((finalizer_object*)self)->pending);
}

static PyGetSetDef finalizer_getset[] = {
  {"ptr", finalizer_get_ptr, NULL, "the allocation's address", NULL},
  {"token", finalizer_get_token, NULL, "the EMM token it frees (never an address)", NULL},
  {"stack", finalizer_get_stack, NULL, "the mrstack_stack* it frees into, as an int", NULL},
  {"pending", finalizer_get_pending, NULL, "True until the first call", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot finalizer_slots[] = {
  {Py_tp_dealloc, SLOT_FUNCTION(finalizer_dealloc)},
  {Py_tp_call, SLOT_FUNCTION(finalizer_call)},
  {Py_tp_repr, SLOT_FUNCTION(finalizer_repr)},
  {Py_tp_getset, finalizer_getset},
  {Py_tp_doc, (void*)"Frees one Numba EMM allocation by its token when called; later calls do nothing."},
  {0, NULL},
};

static PyType_Spec finalizer_spec = {
  "mrstack._fastpath.Finalizer", sizeof(finalizer_object), 0,
  /* Only memalloc makes them: a finalizer built from Python could name any token. */
  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, finalizer_slots,
};

/* memalloc(stack, size, client) -> Finalizer (its .ptr is the memory) or None on failure,
 * when mrstack_last_error() and mrstack_last_error_status() say why. */
static PyObject* fastpath_memalloc(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  (void)module;
  mrstack_stack* stack;
  size_t size;
  int client;
  if (check_arguments("memalloc", nargs, 3) < 0 || check_bound() < 0 || stack_argument(args[0], &stack) < 0 ||
      size_argument(args[1], "mrstack.numba: memalloc", &size) < 0 || int_argument(args[2], &client) < 0) {
    return NULL;
  }
  /* Made before the allocation: were it to fail afterwards, the memory would leak until
   * a reset. */
  finalizer_object* f = PyObject_New(finalizer_object, finalizer_type);
  if (f == NULL) { return NULL; }
  mrstack_emm_allocation allocation;
  Py_BEGIN_ALLOW_THREADS
  allocation = c_api.emm_memalloc_pair(stack, size, client);
  Py_END_ALLOW_THREADS
  if (allocation.token == 0) {
    f->pending = 0;
    Py_DECREF(f);
    Py_RETURN_NONE;
  }
  f->stack = stack;
  f->ptr = allocation.ptr;
  f->token = allocation.token;
  f->size = size;
  f->client = client;
  f->pending = 1;
  return (PyObject*)f;
}

/* ---- Allocation: owns one plain allocation, freed when the object dies -------------- */

typedef struct {
  PyObject_HEAD
  mrstack_stack* stack;
  void* ptr;
  size_t size;
  void* stream;
  int client;
} allocation_object;

static void allocation_dealloc(PyObject* self) {
  allocation_object* a = (allocation_object*)self;
  if (a->ptr != NULL) {
    mrstack_status status;
    Py_BEGIN_ALLOW_THREADS
    status = c_api.deallocate(a->stack, a->ptr, a->size, a->stream, a->client);
    Py_END_ALLOW_THREADS
    if (status != MRSTACK_SUCCESS) {
      /* A destructor cannot raise: the refusal is reported (as the ctypes path's __del__
       * reports it), and should the report raise, Python is told it was unraisable. The
       * exception being raised when the object died, if any, is kept for its caller. */
      PyObject *type, *value, *traceback;
      PyErr_Fetch(&type, &value, &traceback);
      PyObject* reported = report_refused_free(a->client, (unsigned long long)(uintptr_t)a->ptr, a->size);
      if (reported == NULL) {
        PyErr_WriteUnraisable(c_api.report);
      } else {
        Py_DECREF(reported);
      }
      PyErr_Restore(type, value, traceback);
    }
  }
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
}

static PyObject* allocation_repr(PyObject* self) {
  allocation_object* a = (allocation_object*)self;
  char text[128];
  PyOS_snprintf(text, sizeof text, "<mrstack._fastpath.Allocation ptr=%#llx size=%llu stream=%#llx>",
                (unsigned long long)(uintptr_t)a->ptr, (unsigned long long)a->size,
                (unsigned long long)(uintptr_t)a->stream);
  return PyUnicode_FromString(text);
}

static PyObject* allocation_get_ptr(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromVoidPtr(((allocation_object*)self)->ptr);
}

static PyObject* allocation_get_size(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromSize_t(((allocation_object*)self)->size);
}

static PyObject* allocation_get_stream(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromVoidPtr(((allocation_object*)self)->stream);
}

static PyGetSetDef allocation_getset[] = {
  {"ptr", allocation_get_ptr, NULL, "the address (0 for zero bytes)", NULL},
  {"size", allocation_get_size, NULL, "the size asked for", NULL},
  {"stream", allocation_get_stream, NULL, "the stream it is ordered on and freed on, as an int", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot allocation_slots[] = {
  {Py_tp_dealloc, SLOT_FUNCTION(allocation_dealloc)},
  {Py_tp_repr, SLOT_FUNCTION(allocation_repr)},
  {Py_tp_getset, allocation_getset},
  {Py_tp_doc, (void*)"One allocation from a stack, returned to it on its stream when this object dies."},
  {0, NULL},
};

static PyType_Spec allocation_spec = {
  "mrstack._fastpath.Allocation", sizeof(allocation_object), 0,
  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, allocation_slots,
};

/* allocate(stack, size, stream, client) -> Allocation or None on failure (the C ABI's
 * last error and status say why). */
static PyObject* fastpath_allocate(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  (void)module;
  mrstack_stack* stack;
  size_t size;
  void* stream;
  int client;
  if (check_arguments("allocate", nargs, 4) < 0 || check_bound() < 0 || stack_argument(args[0], &stack) < 0 ||
      size_argument(args[1], "mrstack.cupy: allocate", &size) < 0 || pointer_argument(args[2], &stream) < 0 ||
      int_argument(args[3], &client) < 0) {
    return NULL;
  }
  allocation_object* a = PyObject_New(allocation_object, allocation_type);
  if (a == NULL) { return NULL; }
  a->ptr = NULL; /* so that dropping it on failure frees nothing */
  void* ptr = NULL;
  mrstack_status status;
  Py_BEGIN_ALLOW_THREADS
  status = c_api.allocate(stack, size, stream, client, &ptr);
  Py_END_ALLOW_THREADS
  if (status != MRSTACK_SUCCESS) {
    Py_DECREF(a);
    Py_RETURN_NONE;
  }
  a->stack = stack;
  a->ptr = ptr;
  a->size = size;
  a->stream = stream;
  a->client = client;
  return (PyObject*)a;
}

/* ---- bind ---------------------------------------------------------------------------- */

static int address_argument(PyObject* value, unsigned long long* out) {
  unsigned long long v = PyLong_AsUnsignedLongLong(value);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) { return -1; }
  if (v == 0) {
    PyErr_SetString(PyExc_ValueError, "mrstack._fastpath.bind: a function address is 0");
    return -1;
  }
  *out = v;
  return 0;
}

/* bind(c_api_version, emm_memalloc_pair, emm_free, allocate, deallocate, report): the
 * addresses of those C ABI functions (mrstack_c_api_version, ...), as ints, and the callable
 * told of a refused free, report(client, ptr, size). Checks the library's C ABI version
 * against the header this module was built with. */
static PyObject* fastpath_bind(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  (void)module;
  unsigned long long addresses[5];
  if (check_arguments("bind", nargs, 6) < 0) { return NULL; }
  for (int i = 0; i < 5; ++i) {
    if (address_argument(args[i], &addresses[i]) < 0) { return NULL; }
  }
  if (!PyCallable_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "mrstack._fastpath.bind: report must be callable");
    return NULL;
  }
  if (c_api.emm_free != NULL) {
    for (int i = 0; i < 5; ++i) {
      if (addresses[i] != c_api.addresses[i]) {
        PyErr_SetString(PyExc_RuntimeError,
                        "mrstack._fastpath.bind: already bound to another copy of the library (one per process)");
        return NULL;
      }
    }
    Py_RETURN_NONE;
  }
  /* Integer to function pointer: how a C ABI address taken from ctypes becomes callable. */
  int version = ((c_api_version_fn)(uintptr_t)addresses[0])();
  if (version != MRSTACK_C_API_VERSION) {
    PyErr_Format(PyExc_RuntimeError, "mrstack._fastpath was built for C ABI version %d; the library implements %d",
                 MRSTACK_C_API_VERSION, version);
    return NULL;
  }
  c_api.emm_memalloc_pair = (emm_memalloc_pair_fn)(uintptr_t)addresses[1];
  c_api.allocate = (allocate_fn)(uintptr_t)addresses[3];
  c_api.deallocate = (deallocate_fn)(uintptr_t)addresses[4];
  for (int i = 0; i < 5; ++i) { c_api.addresses[i] = addresses[i]; }
  Py_INCREF(args[5]);
  c_api.report = args[5]; /* kept for the process: frees are reported until it ends */
  c_api.emm_free = (emm_free_fn)(uintptr_t)addresses[2]; /* last: check_bound() looks at it */
  Py_RETURN_NONE;
}

static PyObject* fastpath_bound(PyObject* module, PyObject* unused) {
  (void)module;
  (void)unused;
  return PyBool_FromLong(c_api.emm_free != NULL);
}

/* METH_FASTCALL functions take (self, args, nargs): PyMethodDef stores them as a
 * PyCFunction, through void(*)(void) so the compiler sees the cast is meant. */
#define FASTCALL(fn) ((PyCFunction)(void (*)(void))(fn))

static PyMethodDef fastpath_methods[] = {
  {"bind", FASTCALL(fastpath_bind), METH_FASTCALL,
   "bind(c_api_version, emm_memalloc_pair, emm_free, allocate, deallocate, report): the C ABI's function "
   "addresses and report(client, ptr, size), told of a refused free"},
  {"bound", fastpath_bound, METH_NOARGS, "True once bind() succeeded"},
  {"memalloc", FASTCALL(fastpath_memalloc), METH_FASTCALL,
   "memalloc(stack, size, client) -> Finalizer (its .ptr is the memory), or None on failure"},
  {"allocate", FASTCALL(fastpath_allocate), METH_FASTCALL,
   "allocate(stack, size, stream, client) -> Allocation (freed when it dies), or None on failure"},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
  PyModuleDef_HEAD_INIT, "mrstack._fastpath",
  "mrstack's hot path (Numba memalloc/free, CuPy allocate/free) without ctypes; see mrstack._lib.fastpath().", -1,
  fastpath_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
  PyObject* module = PyModule_Create(&fastpath_module);
  if (module == NULL) { return NULL; }
  finalizer_type = (PyTypeObject*)PyType_FromSpec(&finalizer_spec);
  allocation_type = (PyTypeObject*)PyType_FromSpec(&allocation_spec);
  if (finalizer_type == NULL || allocation_type == NULL ||
      PyModule_AddObjectRef(module, "Finalizer", (PyObject*)finalizer_type) < 0 ||
      PyModule_AddObjectRef(module, "Allocation", (PyObject*)allocation_type) < 0 ||
      PyModule_AddIntConstant(module, "C_API_VERSION", MRSTACK_C_API_VERSION) < 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
