/* mrstack's C ABI: a small stable surface for any foreign host (ctypes, cffi, Julia, Rust,
 * PyTorch's pluggable allocator). Built into libmrstack_c.so.
 *
 * Rules of the surface:
 * - No C++ exception crosses it. Every call that can fail returns an `mrstack_status`;
 *   on failure `mrstack_last_error()` gives this thread's message (and, for a bad spec,
 *   `mrstack_last_error_column()` the 1-based column the parser points at). A successful
 *   call leaves the last error as it was.
 * - The header needs no CUDA header: streams are `void*` (a cudaStream_t; NULL is the
 *   legacy default stream).
 * - Stacks are opaque handles, not addresses: a handle used after mrstack_stack_destroy,
 *   or a value no call returned as a handle, is refused (MRSTACK_ERROR_INVALID_ARGUMENT,
 *   with a message saying which), never dereferenced. A destroy waits for calls still
 *   running on the stack in other threads.
 * - Stacks are opaque. `mrstack_device_stack(device)` gives the process-wide stack of a
 *   device, built on first use from the configured spec (`mrstack_configure`, else the
 *   MRSTACK_RESOURCE environment variable, else MRSTACK_DEFAULT_SPEC) and kept until the
 *   process exits; Numba, CuPy and PyTorch all allocate from it, so one pool serves all
 *   three. `mrstack_stack_create(spec)` makes a private stack the caller destroys.
 * - In a spec given here, `{pid}` in a parameter's value becomes the process id when the
 *   stack is built (error columns still count in the spec as given), so each
 *   process of a multi-process program can log to a file of its own:
 *   `logging(file="alloc-{pid}.csv") > pool > cuda`.
 * - Every allocation is tagged with a client (numba, cupy, torch, other); per-client live
 *   and peak bytes are in `mrstack_statistics`.
 * - Thread-safe throughout.
 */
#ifndef MRSTACK_C_API_H
#define MRSTACK_C_API_H

#include <stddef.h>
#include <stdint.h>

/* libmrstack_c.so is built with hidden visibility: only what carries this is exported. */
#if defined(__GNUC__) || defined(__clang__)
#define MRSTACK_C_EXPORT __attribute__((visibility("default")))
#else
#define MRSTACK_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's signature or a struct's layout changes. */
#define MRSTACK_C_API_VERSION 1
/* The stack a device gets when neither mrstack_configure nor MRSTACK_RESOURCE says otherwise. */
#define MRSTACK_DEFAULT_SPEC "pool > cuda"
/* Size of the opaque CUDA IPC handle (cudaIpcMemHandle_t / CUipcMemHandle). */
#define MRSTACK_IPC_HANDLE_BYTES 64

typedef enum mrstack_status {
  MRSTACK_SUCCESS = 0,
  MRSTACK_ERROR_INVALID_ARGUMENT = 1, /* a null, destroyed or foreign stack handle, a null out-pointer,
                                         an unknown client, a bad device */
  MRSTACK_ERROR_SPEC = 2,             /* the spec is malformed: see mrstack_last_error_column() */
  MRSTACK_ERROR_OUT_OF_MEMORY = 3,    /* the stack refused: the message names sizes and free memory */
  MRSTACK_ERROR_CUDA = 4,             /* a CUDA runtime or driver call failed */
  MRSTACK_ERROR_LOGIC = 5,            /* a contract was broken: foreign pointer, unshareable memory, ... */
  MRSTACK_ERROR_STATE = 6,            /* the call comes too late or too early (configure after first use) */
  MRSTACK_ERROR_UNKNOWN = 7
} mrstack_status;

typedef enum mrstack_client {
  MRSTACK_CLIENT_OTHER = 0,
  MRSTACK_CLIENT_NUMBA = 1,
  MRSTACK_CLIENT_CUPY = 2,
  MRSTACK_CLIENT_TORCH = 3,
  MRSTACK_CLIENT_COUNT = 4
} mrstack_client;

typedef struct mrstack_stack mrstack_stack;

/* An EMM allocation: `token` is its finalizer's key (unique, never 0, never an address). */
typedef struct mrstack_memory_pointer {
  uint64_t ptr;
  uint64_t size;
  uint64_t token;
  int32_t device;
  int32_t client;
} mrstack_memory_pointer;

typedef struct mrstack_ipc_handle {
  unsigned char handle[MRSTACK_IPC_HANDLE_BYTES]; /* of the base allocation */
  uint64_t base;      /* start of the upstream allocation containing the pointer */
  uint64_t base_size; /* its size */
  uint64_t offset;    /* pointer - base */
  int32_t device;
  int32_t reserved; /* MRSTACK_IPC_HANDLE_VMM for a vmm IPC handle, else 0 */
} mrstack_ipc_handle;

typedef struct mrstack_client_statistics {
  uint64_t live_bytes;  /* bytes this client holds now */
  uint64_t peak_bytes;  /* the most it held at once */
  uint64_t live_count;  /* allocations it holds now */
  uint64_t allocations; /* allocations it ever made */
} mrstack_client_statistics;

typedef struct mrstack_statistics {
  uint64_t live_bytes;       /* all clients together */
  uint64_t peak_bytes;
  uint64_t free_bytes_held;  /* what the stack holds free (a pool's free blocks) */
  uint64_t emm_outstanding;  /* EMM allocations not yet finalized */
  int32_t device;
  int32_t deferral_depth;    /* active EMM cleanup guards */
  mrstack_client_statistics clients[MRSTACK_CLIENT_COUNT];
} mrstack_statistics;

/* ---- errors and versions ----------------------------------------------------------- */
MRSTACK_C_EXPORT int mrstack_c_api_version(void);
/* This thread's last error message; "" when none. Valid until this thread's next failing call. */
MRSTACK_C_EXPORT const char* mrstack_last_error(void);
/* 1-based column of the last spec error on this thread, counted in bytes of the spec's
 * UTF-8 text (the Python package turns it into characters); 0 when the last error was not one. */
MRSTACK_C_EXPORT size_t mrstack_last_error_column(void);
/* The status of this thread's last failure (for calls that return a token or a pointer). */
MRSTACK_C_EXPORT int mrstack_last_error_status(void);
/* "MRSTACK_ERROR_SPEC" and so on; "unknown status" for anything else. */
MRSTACK_C_EXPORT const char* mrstack_status_name(int status);
/* "numba", "cupy", "torch", "other"; NULL for anything else. */
MRSTACK_C_EXPORT const char* mrstack_client_name(int client);

/* ---- the process-wide per-device stacks ------------------------------------------- */
/* Sets the spec every device stack is built from. Before any device stack exists; again
 * later only with the same spec (MRSTACK_ERROR_STATE otherwise). NULL goes back to
 * MRSTACK_RESOURCE / MRSTACK_DEFAULT_SPEC. The spec's names, parameters and values are
 * checked here (MRSTACK_ERROR_SPEC), without building anything or calling CUDA. */
MRSTACK_C_EXPORT mrstack_status mrstack_configure(const char* spec);
/* Copies the spec device stacks are (or will be) built from into `buffer` (NUL-terminated,
 * truncated to `capacity`); `*length` (if not NULL) gets its full length. A null `buffer`
 * with a `capacity` other than 0 is MRSTACK_ERROR_INVALID_ARGUMENT (nothing written). */
MRSTACK_C_EXPORT mrstack_status mrstack_configured_spec(char* buffer, size_t capacity, size_t* length);
/* The stack of `device`, built on first use (on that device) and kept for the process.
 * A device this machine does not have is MRSTACK_ERROR_INVALID_ARGUMENT, as for
 * mrstack_stack_create. */
MRSTACK_C_EXPORT mrstack_status mrstack_device_stack(int device, mrstack_stack** out);
/* The device stack if it was built already, else NULL (never builds one). */
MRSTACK_C_EXPORT mrstack_stack* mrstack_device_stack_if_built(int device);

/* ---- private stacks ------------------------------------------------------------------ */
/* Builds the stack `spec` describes for `device`: the build runs with that device current (its
 * upstreams, events and percentages belong to it), as do the stack's allocations and frees;
 * the caller's current device is left as it was (docs/multi_gpu.md). A device past the 64
 * that can have a stack, or one at or past the CUDA runtime's device count, is
 * MRSTACK_ERROR_INVALID_ARGUMENT naming the ordinal and the count; without a device to
 * count (a CPU-only machine) an ordinal below 64 only labels a stack over host or
 * simulated memory. */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_create(const char* spec, int device, mrstack_stack** out);
/* Frees everything its EMM adapter still holds and destroys it; the handle is then dead.
 * Allocations made with mrstack_allocate and still live are a broken contract: the stack is
 * destroyed all the same, and MRSTACK_ERROR_LOGIC's message gives their count and bytes and
 * what became of them (freed through a tracking layer on top of the stack; returned with a
 * suballocator's chunks; else leaked). Device stacks are refused (MRSTACK_ERROR_STATE). */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_destroy(mrstack_stack* stack);
/* "pool > cuda": the layers as the spec names them, copied as mrstack_configured_spec does. */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_describe(const mrstack_stack* stack, char* buffer, size_t capacity,
                                                       size_t* length);

/* ---- plain allocation --------------------------------------------------------------- */
MRSTACK_C_EXPORT mrstack_status mrstack_allocate(mrstack_stack* stack, size_t bytes, void* stream, int client,
                                                 void** out);
/* `bytes` and `client` as allocated. A null pointer with 0 bytes (what an allocation of 0
 * bytes returns) is a no-op; a null pointer with a size is MRSTACK_ERROR_LOGIC. So is a free
 * that is not exactly a live allocation of this stack (another size or client, a pointer
 * it did not hand out, a second free): the message names both sizes and clients, and
 * nothing is freed. */
MRSTACK_C_EXPORT mrstack_status mrstack_deallocate(mrstack_stack* stack, void* ptr, size_t bytes, void* stream,
                                                   int client);

/* ---- Numba's External Memory Management plugin interface ---------------------------- */
MRSTACK_C_EXPORT int mrstack_emm_interface_version(void);
MRSTACK_C_EXPORT mrstack_status mrstack_emm_initialize(mrstack_stack* stack);
MRSTACK_C_EXPORT mrstack_status mrstack_emm_memalloc(mrstack_stack* stack, size_t bytes, int client,
                                                     mrstack_memory_pointer* out);
/* The same, for hot callers: returns the token and writes the pointer to `*ptr`; returns 0
 * on failure (mrstack_last_error() and mrstack_last_error_status() say why). */
MRSTACK_C_EXPORT uint64_t mrstack_emm_memalloc_token(mrstack_stack* stack, size_t bytes, int client, uint64_t* ptr);
/* The same again, both results in registers (fastest through ctypes: no out-parameter to
 * build); `token` is 0 on failure. */
typedef struct mrstack_emm_allocation {
  uint64_t ptr;
  uint64_t token;
} mrstack_emm_allocation;
MRSTACK_C_EXPORT mrstack_emm_allocation mrstack_emm_memalloc_pair(mrstack_stack* stack, size_t bytes, int client);
/* The finalizer: returns the memory of `token` to the stack exactly once. Returns 1 when
 * it freed (or queued) memory, 0 when the token was already freed or made stale by a
 * reset (a no-op), -1 on failure: among them a token this stack never issued (another
 * stack's, or 0), MRSTACK_ERROR_LOGIC, which frees nothing. */
MRSTACK_C_EXPORT int mrstack_emm_free(mrstack_stack* stack, uint64_t token);
/* (free, total) bytes of the stack's device, counting what the stack holds free as free. */
MRSTACK_C_EXPORT mrstack_status mrstack_emm_get_memory_info(mrstack_stack* stack, size_t* free_bytes,
                                                            size_t* total_bytes);
MRSTACK_C_EXPORT mrstack_status mrstack_emm_get_ipc_handle(mrstack_stack* stack, const void* ptr,
                                                           mrstack_ipc_handle* out);
/* Frees every outstanding EMM allocation (stale finalizers become no-ops); `*released`
 * (if not NULL) gets how many. */
MRSTACK_C_EXPORT mrstack_status mrstack_emm_reset(mrstack_stack* stack, size_t* released);
/* For tests, so the refusal paths of EMM frees (a reset's, a finalizer's) can be exercised
 * where no right free is refused (no driver to fail); never called in production. The next
 * `count` frees the stack's EMM adapter forwards are refused (MRSTACK_ERROR_LOGIC, the stack
 * keeping the memory) instead of reaching the stack; 0 cancels what is pending. */
MRSTACK_C_EXPORT mrstack_status mrstack_emm_refuse_next_frees_for_tests(mrstack_stack* stack, size_t count);
/* A cleanup guard in two calls: frees wait until the outermost end. */
MRSTACK_C_EXPORT mrstack_status mrstack_emm_defer_begin(mrstack_stack* stack);
MRSTACK_C_EXPORT mrstack_status mrstack_emm_defer_end(mrstack_stack* stack);

/* ---- vmm stacks: IPC of vmm memory, sleep and wake ------------------------------------ */
/* `mrstack_ipc_handle.reserved` has this bit when `handle` is an mrstack vmm IPC handle. */
#define MRSTACK_IPC_HANDLE_VMM 1
/* As mrstack_emm_get_ipc_handle, given the block's size: for memory of a `vmm` layer (made
 * with ipc=fd or ipc=fabric; the default ipc=auto is fd where the device supports it) the
 * handle names exactly [ptr, ptr + bytes), `base` = ptr, `offset` = 0, and `reserved` has
 * MRSTACK_IPC_HANDLE_VMM; another process of the same host opens it with mrstack_ipc_open
 * while this process keeps the block live. For cudaMalloc memory it is mrstack_emm_get_ipc_handle. */
MRSTACK_C_EXPORT mrstack_status mrstack_emm_get_ipc_handle_sized(mrstack_stack* stack, const void* ptr, size_t bytes,
                                                                 mrstack_ipc_handle* out);
/* 1 when the MRSTACK_IPC_HANDLE_BYTES at `handle` are an mrstack vmm IPC handle, else 0. */
MRSTACK_C_EXPORT int mrstack_ipc_is_vmm_handle(const unsigned char* handle);
/* Maps the block a vmm IPC handle names on `device` (-1: the current one) and writes its
 * address to `*out` (the exporter's socket and file descriptors: docs/vmm.md). */
MRSTACK_C_EXPORT mrstack_status mrstack_ipc_open(const unsigned char* handle, int device, void** out);
/* Unmaps what mrstack_ipc_open returned. */
MRSTACK_C_EXPORT mrstack_status mrstack_ipc_close(void* ptr);
/* Sleep: the stack releases what it holds free, then its vmm layer gives back all physical
 * memory, keeping addresses; with `keep_contents` the bytes of every committed granule are
 * copied to pinned host memory first. Until mrstack_stack_wake, allocations from the stack
 * fail (MRSTACK_ERROR_LOGIC), frees work, and nothing may touch its memory. A stack without
 * a vmm layer: MRSTACK_ERROR_LOGIC. */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_sleep(mrstack_stack* stack, int keep_contents);
/* Wake: physical memory mapped back at the same addresses, contents restored if kept. */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_wake(mrstack_stack* stack);
/* 1 while the stack is asleep, else 0. */
MRSTACK_C_EXPORT int mrstack_stack_is_asleep(mrstack_stack* stack);

/* ---- statistics --------------------------------------------------------------------- */
MRSTACK_C_EXPORT mrstack_status mrstack_get_statistics(mrstack_stack* stack, mrstack_statistics* out);
/* Sets every client's peak to what it holds now. */
MRSTACK_C_EXPORT mrstack_status mrstack_reset_peaks(mrstack_stack* stack);

/* ---- fragmentation and release ------------------------------------------------------ */
/* Free memory of one stream, where a suballocator keeps free blocks per stream. */
typedef struct mrstack_fragmentation_stream {
  uint64_t stream;             /* the cudaStream_t (0: the legacy default stream), or a thread key */
  uint64_t free_bytes;
  uint64_t largest_free_block;
  uint64_t free_blocks;
  int32_t thread_bound;        /* 1: a per-thread default stream; `stream` is then a thread key */
  int32_t reserved;
} mrstack_fragmentation_stream;

/* How fragmented the free memory a stack holds is, answered by its topmost suballocator
 * (adaptors pass the query down). `resource` is "" when no layer keeps such books (a
 * plain upstream): every number is then 0. Where it is not "": live_bytes + free_bytes <=
 * held_bytes (the rest is held but neither handed out nor free to hand out: the tail of an
 * arena superblock its size class cannot use, a chunk's alignment slack) and
 * largest_free_block <= free_bytes. */
typedef struct mrstack_fragmentation {
  char resource[32];            /* the layer that answered: "pool", "arena", ... (NUL-terminated) */
  uint64_t held_bytes;          /* bytes it holds from its upstream (its footprint) */
  uint64_t live_bytes;          /* bytes handed out and not yet freed */
  uint64_t free_bytes;          /* held and free to hand out */
  uint64_t largest_free_block;  /* the largest request it could serve without growing */
  uint64_t free_blocks;         /* number of free blocks (runs of free bytes) */
  uint64_t stream_count;        /* how many per-stream shares there are (may exceed `capacity`) */
  int32_t device;
  int32_t reserved;
} mrstack_fragmentation;

/* One consistent fragmentation query. `streams` (may be NULL when `capacity` is 0) gets
 * the first min(capacity, out->stream_count) per-stream shares. */
MRSTACK_C_EXPORT mrstack_status mrstack_get_fragmentation(mrstack_stack* stack, mrstack_fragmentation* out,
                                                          mrstack_fragmentation_stream* streams, size_t capacity);
/* Gives the free memory the stack holds back to the device where its layers can
 * (a pool's free chunks): what torch.cuda.empty_cache() does for PyTorch's allocator. */
MRSTACK_C_EXPORT mrstack_status mrstack_stack_release(mrstack_stack* stack);

/* ---- PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator) -------- */
/* Serve `device`'s process-wide stack, tagged as client torch. PyTorch does not check the
 * result: on failure mrstack_torch_alloc prints the reason to stderr, records it as this
 * thread's last error and returns NULL. */
MRSTACK_C_EXPORT void* mrstack_torch_alloc(size_t size, int device, void* stream);
MRSTACK_C_EXPORT void mrstack_torch_free(void* ptr, size_t size, int device, void* stream);
/* The same as mrstack_torch_alloc, for PyTorch (a C++ caller) only: on failure it throws
 * the C++ exception (mrstack::out_of_memory, a std::bad_alloc naming the request, the
 * footprint, the free bytes and the largest free block) instead of returning NULL, so
 * PyTorch raises it in Python (see mrstack_torch_bind_c10). It also refuses, with an
 * exception, any allocation on a stream being captured into a CUDA graph. The one
 * function of this header an exception leaves. */
MRSTACK_C_EXPORT void* mrstack_torch_alloc_raising(size_t size, int device, void* stream);
/* Makes mrstack_torch_alloc_raising throw c10::OutOfMemoryError (torch.OutOfMemoryError in
 * Python), built by the constructor of the libc10.so at `libc10_path` (the one PyTorch
 * loaded). MRSTACK_ERROR_STATE when that library lacks it; the exception then stays
 * mrstack's own (PyTorch raises RuntimeError with the same message). */
MRSTACK_C_EXPORT mrstack_status mrstack_torch_bind_c10(const char* libc10_path);
/* Tensor.record_stream for mrstack: the free of `ptr` (by mrstack_torch_free) makes its
 * stream wait for the work enqueued on `stream` up to now, before the block is reused.
 * `ptr` must be a block mrstack_torch_alloc returned and not yet freed (a storage's base,
 * not a view's data pointer): the event is kept, keyed by `ptr`, until that free. Any other
 * pointer (never handed out, into a block, already freed) is MRSTACK_ERROR_INVALID_ARGUMENT,
 * checked before any CUDA call, with nothing kept. Recording twice keeps both events.
 * `stream` may belong to another device than the block: the event is made on the
 * stream's device (a null or per-thread default stream: the current device's). */
MRSTACK_C_EXPORT mrstack_status mrstack_torch_record_stream(void* ptr, void* stream);
typedef struct mrstack_torch_stats {
  uint64_t num_ooms;             /* PyTorch allocations the device's stack refused */
  uint64_t peak_reserved_bytes;  /* largest footprint seen when PyTorch's live bytes peaked */
} mrstack_torch_stats;
MRSTACK_C_EXPORT mrstack_status mrstack_torch_statistics(int device, mrstack_torch_stats* out);
/* Sets the reserved peak to `reserved_now` (the footprint now) and starts peak sampling over. */
MRSTACK_C_EXPORT mrstack_status mrstack_torch_reset_peak(int device, uint64_t reserved_now);
/* For tests, so record_stream's books can be exercised on hosts without a CUDA driver;
 * never set in production. While `hooks` is set (NULL: unset; the struct must outlive the
 * setting), mrstack_torch_record_stream calls `record` in place of making an event and
 * recording it on `stream`, after it found `ptr` live and with no lock held (a test can
 * free the block there and allocate another at its address), and keeps what `record`
 * returns (NULL: recording failed, MRSTACK_ERROR_CUDA). Every event made so then goes to
 * `destroy` in place of cudaEventDestroy, also when its block is freed after the hooks
 * were unset (so they must outlive every block recorded through them), and a free waits
 * for none. */
typedef struct mrstack_torch_event_hooks {
  void* (*record)(void* ptr, void* stream);
  void (*destroy)(void* event);
} mrstack_torch_event_hooks;
MRSTACK_C_EXPORT void mrstack_torch_set_event_hooks_for_tests(const mrstack_torch_event_hooks* hooks);

/* ---- CUDA stream-ordering calls -------------------------------------------------------- */
/* The CUDA calls the suballocators of this process have made to order memory between
 * streams, since it started, and the time spent inside them: read before and after a
 * region (a training step) to see what it cost. Host-memory stacks make none. */
typedef struct mrstack_stream_sync_counts {
  uint64_t event_creates;
  uint64_t records;                  /* cudaEventRecord */
  uint64_t waits;                    /* cudaStreamWaitEvent */
  uint64_t stream_synchronizations;  /* cudaStreamSynchronize */
  uint64_t device_synchronizations;  /* cudaDeviceSynchronize */
  uint64_t nanoseconds;              /* inside all of them */
  uint64_t idle_queries;             /* cudaStreamQuery: has a stream finished its work? */
} mrstack_stream_sync_counts;
MRSTACK_C_EXPORT mrstack_status mrstack_stream_sync_profile(mrstack_stream_sync_counts* out);

#ifdef __cplusplus
}
#endif

#endif /* MRSTACK_C_API_H */
