/*
 * An emulated CUDA device for tracing Transformer Engine models on a machine without a GPU.
 * te-ckpt-audit preloads it (as libcuda.so.1) into the tracing process only. It defines the CUDA
 * runtime calls TE makes (interposing libcudart's) and the driver calls those lead to.
 *
 * It answers the device queries TE makes while tracing (compute capability, SM count, device
 * limits, loading an NVRTC-compiled kernel and asking its occupancy) as ONE device, and answers
 * "no device" to everything else: nothing can be allocated, launched or copied, so no result can
 * silently come from it. The device's properties come from the environment:
 *
 *   TE_CKPT_AUDIT_GPU_CC    compute capability, "9.0" by default (H100/H200)
 *   TE_CKPT_AUDIT_GPU_SMS   streaming multiprocessors, 132 by default
 *   TE_CKPT_AUDIT_GPU_MEM   device memory in GiB, 80 by default
 *   TE_CKPT_AUDIT_FAKECUDA_TRACE=1 prints each driver entry point asked for, to stderr
 *
 * Written from the public CUDA API documentation; compiled against the CUDA 12 wheels' headers
 * (cuda.h, cuda_runtime_api.h) so every signature and struct layout is theirs. No NVIDIA code.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

static int trace_enabled(void) {
  const char *v = getenv("TE_CKPT_AUDIT_FAKECUDA_TRACE");
  return v && *v && strcmp(v, "0") != 0;
}

static int cc_major(void) {
  const char *v = getenv("TE_CKPT_AUDIT_GPU_CC");
  return v ? atoi(v) : 9;
}

static int cc_minor(void) {
  const char *v = getenv("TE_CKPT_AUDIT_GPU_CC");
  const char *dot = v ? strchr(v, '.') : NULL;
  return dot ? atoi(dot + 1) : 0;
}

static int sm_count(void) {
  const char *v = getenv("TE_CKPT_AUDIT_GPU_SMS");
  return v ? atoi(v) : 132;
}

static size_t total_mem(void) {
  const char *v = getenv("TE_CKPT_AUDIT_GPU_MEM");
  return (size_t)(v ? atof(v) : 80.0) * ((size_t)1 << 30);
}

/* Provenance: te-ckpt-audit asks the driver loaded in its process what it emulates, never the
 * environment, so a report names an emulated device only where this driver really answered. */
int te_ckpt_audit_emulated_gpu(char *out, int len) {
  if (!out || len <= 0) return -1;
  snprintf(out, (size_t)len, "sm_%d%d, %d SMs, %g GiB", cc_major(), cc_minor(), sm_count(),
           (double)total_mem() / (double)((size_t)1 << 30));
  return 0;
}

/* --- what a tracing process may ask ------------------------------------------------------- */

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int *version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 12090;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "te-ckpt-audit emulated GPU (sm_%d%d, %d SMs)", cc_major(), cc_minor(),
           sm_count());
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = total_mem();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  memset(uuid, 0x7e, sizeof *uuid);
  return CUDA_SUCCESS;
}

static int attribute(int attrib) {
  switch (attrib) {
    case 1: return 1024;                        /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: return 1024;                /* MAX_BLOCK_DIM_X, Y */
    case 4: return 64;                          /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647;                  /* MAX_GRID_DIM_X */
    case 6: case 7: return 65535;               /* MAX_GRID_DIM_Y, Z */
    case 8: return 49152;                       /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: return 65536;                       /* TOTAL_CONSTANT_MEMORY */
    case 10: return 32;                         /* WARP_SIZE */
    case 11: return 2147483647;                 /* MAX_PITCH */
    case 12: return 65536;                      /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;                    /* CLOCK_RATE (kHz) */
    case 14: return 512;                        /* TEXTURE_ALIGNMENT */
    case 16: return sm_count();                 /* MULTIPROCESSOR_COUNT */
    case 19: return 1;                          /* CAN_MAP_HOST_MEMORY */
    case 31: return 1;                          /* CONCURRENT_KERNELS */
    case 36: return 2619000;                    /* MEMORY_CLOCK_RATE (kHz) */
    case 37: return 5120;                       /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 50 * 1024 * 1024;           /* L2_CACHE_SIZE */
    case 39: return 2048;                       /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: return 3;                          /* ASYNC_ENGINE_COUNT */
    case 41: return 1;                          /* UNIFIED_ADDRESSING */
    case 75: return cc_major();                 /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return cc_minor();                 /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;                     /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;                      /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 83: return 1;                          /* MANAGED_MEMORY */
    case 97: return 232448;                     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 106: return 32;                        /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    default: return 0;
  }
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev) {
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  *value = attribute(attrib);
  return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  *major = cc_major();
  *minor = cc_minor();
  return CUDA_SUCCESS;
}

/* One context, so that a kernel can be "loaded" in it; nothing can run in it. */
static char fake_context;
static __thread CUcontext current_context;

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = (CUcontext)&fake_context;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

CUresult cuCtxSetCurrent(CUcontext ctx) {
  current_context = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current_context;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = 0;
  return CUDA_SUCCESS;
}

/* An NVRTC-compiled kernel is "loaded" so its occupancy can be asked; it can never run. */
static char fake_module, fake_function;

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  (void)image;
  if (!module) return CUDA_ERROR_INVALID_VALUE;
  *module = (CUmodule)&fake_module;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned n, CUjit_option *options, void **values) {
  (void)n; (void)options; (void)values;
  return cuModuleLoadData(module, image);
}

CUresult cuModuleUnload(CUmodule module) { (void)module; return CUDA_SUCCESS; }

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
  (void)module; (void)name;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  *fn = (CUfunction)&fake_function;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction fn, CUfunction_attribute attrib, int value) {
  (void)fn; (void)attrib; (void)value;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attrib, CUfunction fn) {
  (void)fn; (void)attrib;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  *value = 0;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction fn, int block_size, size_t smem) {
  (void)fn;
  if (!blocks || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  int by_threads = 2048 / block_size;
  int by_smem = smem ? (int)(233472 / smem) : 32;
  int n = by_threads < by_smem ? by_threads : by_smem;
  *blocks = n < 1 ? 1 : (n > 32 ? 32 : n);
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction fn, int block_size,
                                                              size_t smem, unsigned flags) {
  (void)flags;
  return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, fn, block_size, smem);
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  *text = error == CUDA_SUCCESS ? "no error" : "not available on the te-ckpt-audit emulated GPU";
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  *text = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_NO_DEVICE";
  return CUDA_SUCCESS;
}

/* Everything else: no device. Under the x86-64 and AArch64 C calling conventions a function that
 * ignores its arguments can stand in for any driver entry point returning CUresult. */
static CUresult no_device(void) { return CUDA_ERROR_NO_DEVICE; }
static void *entry_point(const char *symbol);

CUresult cuGetExportTable(const void **table, const CUuuid *id) {
  (void)table; (void)id;
  return CUDA_ERROR_NOT_SUPPORTED;  /* libcudart's private tables: the runtime is interposed instead */
}

/* Our own definition of `symbol` ("cuDeviceTotalMem" means cuDeviceTotalMem_v2 at CUDA >= 3.2,
 * so the _v2 name is tried first), never a same-named symbol of another library. */
static void *own(const char *symbol) {
  Dl_info mine, theirs;
  char versioned[256];
  snprintf(versioned, sizeof versioned, "%s_v2", symbol);
  if (!dladdr((void *)own, &mine)) return NULL;
  void *handle = dlopen(mine.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  void *fn = handle ? dlsym(handle, versioned) : NULL;
  if (!fn && handle) fn = dlsym(handle, symbol);
  if (fn && (!dladdr(fn, &theirs) || theirs.dli_fbase != mine.dli_fbase)) fn = NULL;
  return fn;
}

static void *entry_point(const char *symbol) {
  void *fn = own(symbol);
  if (trace_enabled()) fprintf(stderr, "fakecuda: %s%s\n", symbol, fn ? "" : " -> no device");
  return fn ? fn : (void *)no_device;
}

/* cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; this defines the latter. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) {
  (void)cuda_version; (void)flags;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = entry_point(symbol);
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

/* --- the CUDA runtime calls TE makes while tracing (interposing libcudart.so.12) ----------- */

cudaError_t cudaGetDeviceCount(int *count) { return cuDeviceGetCount(count) ? cudaErrorInvalidValue : cudaSuccess; }

cudaError_t cudaGetDevice(int *device) {
  if (!device) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *value = attribute((int)attr);  /* the runtime's numbering is the driver's */
  return cudaSuccess;
}

/* cuda_runtime_api.h maps cudaGetDeviceProperties to cudaGetDeviceProperties_v2. */
cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
  if (!prop) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  cuDeviceGetName(prop->name, sizeof prop->name, 0);
  prop->totalGlobalMem = total_mem();
  prop->sharedMemPerBlock = (size_t)attribute(8);
  prop->regsPerBlock = attribute(12);
  prop->warpSize = attribute(10);
  prop->maxThreadsPerBlock = attribute(1);
  prop->maxThreadsDim[0] = attribute(2); prop->maxThreadsDim[1] = attribute(3); prop->maxThreadsDim[2] = attribute(4);
  prop->maxGridSize[0] = attribute(5); prop->maxGridSize[1] = attribute(6); prop->maxGridSize[2] = attribute(7);
  prop->totalConstMem = (size_t)attribute(9);
  prop->major = cc_major();
  prop->minor = cc_minor();
  prop->multiProcessorCount = sm_count();
  prop->l2CacheSize = attribute(38);
  prop->maxThreadsPerMultiProcessor = attribute(39);
  prop->sharedMemPerMultiprocessor = (size_t)attribute(81);
  prop->regsPerMultiprocessor = attribute(82);
  prop->sharedMemPerBlockOptin = (size_t)attribute(97);
  prop->maxBlocksPerMultiProcessor = attribute(106);
  prop->memoryBusWidth = attribute(37);
  prop->unifiedAddressing = 1;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) { return cuDriverGetVersion(version) ? cudaErrorInvalidValue : cudaSuccess; }

cudaError_t cudaRuntimeGetVersion(int *version) {
  if (!version) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "not available on the te-ckpt-audit emulated GPU";
}

const char *cudaGetErrorName(cudaError_t error) {
  return error == cudaSuccess ? "cudaSuccess" : "cudaErrorNoDevice";
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version; (void)flags;
  if (!symbol || !fn) return cudaErrorInvalidValue;
  *fn = entry_point(symbol);
  if (status) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *status) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, CUDART_VERSION, flags, status);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, const void *fn, int block_size,
                                                                   size_t smem, unsigned int flags) {
  (void)flags;
  return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, (CUfunction)fn, block_size, smem)
             ? cudaErrorInvalidValue : cudaSuccess;
}

/* --- cuDNN: a handle can be created (TE makes one to choose its attention backend) -------- */

static char fake_cudnn_handle;
int cudnnCreate(void **handle) {  /* cudnnStatus_t cudnnCreate(cudnnHandle_t *) */
  if (!handle) return 3;          /* CUDNN_STATUS_BAD_PARAM */
  *handle = &fake_cudnn_handle;
  return 0;                       /* CUDNN_STATUS_SUCCESS */
}
int cudnnDestroy(void *handle) { (void)handle; return 0; }
int cudnnSetStream(void *handle, void *stream) { (void)handle; (void)stream; return 0; }

/* Anything that would allocate, copy, launch or synchronise: no device. The assembler names let
 * one argument-ignoring body stand for each, whatever its prototype in cuda_runtime_api.h. */
#define NO_DEVICE(name)                                          \
  cudaError_t no_device_##name(void) __asm__(#name);             \
  cudaError_t no_device_##name(void) { return cudaErrorNoDevice; }
NO_DEVICE(cudaMalloc) NO_DEVICE(cudaMallocAsync) NO_DEVICE(cudaMallocHost) NO_DEVICE(cudaHostAlloc)
NO_DEVICE(cudaFree) NO_DEVICE(cudaFreeAsync) NO_DEVICE(cudaFreeHost)
NO_DEVICE(cudaMemcpy) NO_DEVICE(cudaMemcpyAsync) NO_DEVICE(cudaMemcpy2DAsync) NO_DEVICE(cudaMemcpyToSymbol)
NO_DEVICE(cudaMemset) NO_DEVICE(cudaMemsetAsync)
NO_DEVICE(cudaLaunchKernel) NO_DEVICE(cudaLaunchKernelExC)
NO_DEVICE(cudaDeviceSynchronize) NO_DEVICE(cudaStreamSynchronize) NO_DEVICE(cudaStreamCreate)
NO_DEVICE(cudaStreamCreateWithPriority) NO_DEVICE(cudaStreamDestroy) NO_DEVICE(cudaStreamWaitEvent)
NO_DEVICE(cudaStreamBeginCapture) NO_DEVICE(cudaStreamEndCapture) NO_DEVICE(cudaStreamIsCapturing)
NO_DEVICE(cudaEventCreate) NO_DEVICE(cudaEventCreateWithFlags) NO_DEVICE(cudaEventDestroy)
NO_DEVICE(cudaEventRecord) NO_DEVICE(cudaEventSynchronize) NO_DEVICE(cudaEventElapsedTime)
NO_DEVICE(cudaDeviceCanAccessPeer) NO_DEVICE(cudaDeviceGetStreamPriorityRange)
NO_DEVICE(cudaFuncGetAttributes) NO_DEVICE(cudaFuncSetAttribute) NO_DEVICE(cudaGetSymbolAddress)
NO_DEVICE(cudaIpcGetMemHandle) NO_DEVICE(cudaIpcOpenMemHandle) NO_DEVICE(cudaIpcCloseMemHandle)
NO_DEVICE(cudaPointerGetAttributes) NO_DEVICE(cudaGraphDestroy) NO_DEVICE(cudaOccupancyMaxActiveClusters)
