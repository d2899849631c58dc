/* device_usage.c - see device_usage.h.  The NVML declarations below are the few
 * entry points used, with the C types NVML documents for them. */
#include "device_usage.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "log.h"

typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory;

typedef struct nvml_utilization {
    unsigned int gpu, memory; /* percent */
} nvml_utilization;

typedef void *nvml_device;

static struct {
    int usable;
    int (*init)(void);
    int (*handle_by_index)(unsigned int index, nvml_device *dev);
    int (*memory_info)(nvml_device dev, nvml_memory *mem);
    int (*utilization_rates)(nvml_device dev, nvml_utilization *util);
} nvml;

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void nvml_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        gcd_log_info("NVML not found (%s): device memory use and utilisation are not reported",
                     dlerror());
        return;
    }
    *(void **)&nvml.init = dlsym(lib, "nvmlInit_v2");
    *(void **)&nvml.handle_by_index = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.memory_info = dlsym(lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.utilization_rates = dlsym(lib, "nvmlDeviceGetUtilizationRates");
    if (nvml.init == NULL || nvml.handle_by_index == NULL || nvml.memory_info == NULL ||
        nvml.utilization_rates == NULL) {
        gcd_log_warn("NVML lacks an entry point gpucd uses; device use is not reported");
        return;
    }
    int rc = nvml.init();
    if (rc != 0) {
        gcd_log_warn("nvmlInit failed (NVML error %d); device use is not reported", rc);
        return;
    }
    nvml.usable = 1; /* the library stays loaded for the life of the process */
}

int gcd_device_usage_get(const char *backend, int device, gcd_device_usage *out)
{
    memset(out, 0, sizeof *out);
    if (backend == NULL || strcmp(backend, "cuda") != 0)
        return -1;
    pthread_once(&nvml_once, nvml_load);
    if (!nvml.usable)
        return -1;
    nvml_device dev;
    nvml_memory mem;
    nvml_utilization util;
    if (nvml.handle_by_index((unsigned int)device, &dev) != 0 || nvml.memory_info(dev, &mem) != 0 ||
        nvml.utilization_rates(dev, &util) != 0)
        return -1;
    out->memory_total_bytes = mem.total;
    out->memory_used_bytes = mem.used;
    out->utilization = util.gpu / 100.0;
    return 0;
}
