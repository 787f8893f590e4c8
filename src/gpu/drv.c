#include "gpu/drv.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Versioned entry points: the _v2 forms are what cuda.h's macros select. */
static const struct { const char *name; size_t off; } SYMS[] = {
#define S(field, sym) {sym, offsetof(drv_api, field)}
    S(Init, "cuInit"),
    S(DriverGetVersion, "cuDriverGetVersion"),
    S(DeviceGetCount, "cuDeviceGetCount"),
    S(DeviceGet, "cuDeviceGet"),
    S(DeviceGetName, "cuDeviceGetName"),
    S(DeviceGetAttribute, "cuDeviceGetAttribute"),
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    S(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    S(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    S(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    S(CtxGetCurrent, "cuCtxGetCurrent"),
    S(CtxSynchronize, "cuCtxSynchronize"),
    S(ModuleLoadData, "cuModuleLoadData"),
    S(ModuleUnload, "cuModuleUnload"),
    S(ModuleGetFunction, "cuModuleGetFunction"),
    S(FuncSetAttribute, "cuFuncSetAttribute"),
    S(FuncGetAttribute, "cuFuncGetAttribute"),
    S(LaunchKernelEx, "cuLaunchKernelEx"),
    S(MemAlloc, "cuMemAlloc_v2"),
    S(MemFree, "cuMemFree_v2"),
    S(MemAllocHost, "cuMemAllocHost_v2"),
    S(MemFreeHost, "cuMemFreeHost"),
    S(MemcpyHtoD, "cuMemcpyHtoD_v2"),
    S(MemcpyDtoH, "cuMemcpyDtoH_v2"),
    S(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    S(Memcpy2DAsync, "cuMemcpy2DAsync_v2"),
    S(MemsetD8, "cuMemsetD8_v2"),
    S(StreamSynchronize, "cuStreamSynchronize"),
    S(StreamCreate, "cuStreamCreate"),
    S(StreamDestroy, "cuStreamDestroy_v2"),
    S(StreamWaitEvent, "cuStreamWaitEvent"),
    S(StreamBeginCapture, "cuStreamBeginCapture_v2"),
    S(StreamEndCapture, "cuStreamEndCapture"),
    S(GraphInstantiate, "cuGraphInstantiateWithFlags"),
    S(GraphLaunch, "cuGraphLaunch"),
    S(GraphExecDestroy, "cuGraphExecDestroy"),
    S(GraphDestroy, "cuGraphDestroy"),
    S(EventCreate, "cuEventCreate"),
    S(EventDestroy, "cuEventDestroy_v2"),
    S(EventRecord, "cuEventRecord"),
    S(EventSynchronize, "cuEventSynchronize"),
    S(EventElapsedTime, "cuEventElapsedTime_v2"),
    S(PointerGetAttribute, "cuPointerGetAttribute"),
    S(TensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
    S(OccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters"),
    S(GetErrorName, "cuGetErrorName"),
    S(GetErrorString, "cuGetErrorString"),
#undef S
};

const char *drv_err_str(const drv_device *d, CUresult r)
{
    static __thread char buf[256];
    const char *name = NULL, *text = NULL;
    if (d->lib && d->api.GetErrorName)
        d->api.GetErrorName(r, &name);
    if (d->lib && d->api.GetErrorString)
        d->api.GetErrorString(r, &text);
    snprintf(buf, sizeof buf, "%s (%d): %s", name ? name : "CUDA_ERROR", (int)r,
             text ? text : "unknown error");
    return buf;
}

void drv_arch_name(int major, int minor, char *out, size_t n)
{
    /* Hopper's wgmma and setmaxnreg exist only in the arch-specific target. */
    snprintf(out, n, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

static int attr(drv_device *d, CUdevice_attribute a)
{
    int v = 0;
    if (d->api.DeviceGetAttribute(&v, a, d->dev) != CUDA_SUCCESS)
        return 0;
    return v;
}

void drv_open(drv_device *d, int ordinal)
{
    memset(d, 0, sizeof *d);
    /* A CUDA_VISIBLE_DEVICES-style switch for tests of the no-GPU path. */
    const char *off = getenv("STOF_NO_GPU");
    if (off && *off && strcmp(off, "0") != 0) {
        snprintf(d->why, sizeof d->why, "no GPU: STOF_NO_GPU is set");
        return;
    }
    d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        snprintf(d->why, sizeof d->why, "no GPU driver: dlopen(libcuda.so.1) failed: %s",
                 dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++) {
        void *f = dlsym(d->lib, SYMS[i].name);
        if (!f) {
            snprintf(d->why, sizeof d->why, "the CUDA driver lacks %s: too old?", SYMS[i].name);
            drv_close(d);
            return;
        }
        memcpy((char *)&d->api + SYMS[i].off, &f, sizeof f);
    }
    CUresult r = d->api.Init(0);
    int count = 0;
    if (r == CUDA_SUCCESS)
        r = d->api.DeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        snprintf(d->why, sizeof d->why, "no GPU: %s",
                 r != CUDA_SUCCESS ? drv_err_str(d, r) : "the driver sees no device");
        drv_close(d);
        return;
    }
    if (ordinal < 0 || ordinal >= count) {
        snprintf(d->why, sizeof d->why, "no GPU %d: the driver sees %d device(s)", ordinal,
                 count);
        drv_close(d);
        return;
    }
    if ((r = d->api.DeviceGet(&d->dev, ordinal)) != CUDA_SUCCESS ||
        (r = d->api.DevicePrimaryCtxRetain(&d->cu, d->dev)) != CUDA_SUCCESS) {
        snprintf(d->why, sizeof d->why, "GPU %d unusable: %s", ordinal, drv_err_str(d, r));
        drv_close(d);
        return;
    }
    d->api.DeviceGetName(d->name, sizeof d->name, d->dev);
    d->api.DriverGetVersion(&d->driver_version);
    d->cc_major = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    d->cc_minor = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    d->sm_count = attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    d->smem_optin = attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    d->l2_bytes = attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    d->ok = 1;
}

void drv_close(drv_device *d)
{
    if (d->ok)
        d->api.DevicePrimaryCtxRelease(d->dev);
    if (d->lib)
        dlclose(d->lib);
    d->lib = NULL;
    d->ok = 0;
}
