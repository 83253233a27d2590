/*
 * The driver version for device records. The display driver's own version
 * ("580.65.06", what nvidia-smi shows) comes from NVML, which ships with
 * the driver, not with the toolkit: it is opened with dlopen so that the
 * plugin loads where NVML is absent. Without it, the CUDA driver API
 * version the driver implements ("13.0") is the best we can say.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "cuda.h"

/* NVML's calls as nvml.h declares them; 0 is NVML_SUCCESS. */
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_version_fn)(char *version, unsigned int length);
typedef int (*nvml_shutdown_fn)(void);

static int nvml_version(char *out, size_t size)
{
	void *dl = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	nvml_init_fn init;
	nvml_version_fn version;
	nvml_shutdown_fn shutdown;
	char buf[96] = "";
	int ok = 0;

	if (!dl)
		return 0;
	init = (nvml_init_fn)dlsym(dl, "nvmlInit_v2");
	version = (nvml_version_fn)dlsym(dl, "nvmlSystemGetDriverVersion");
	shutdown = (nvml_shutdown_fn)dlsym(dl, "nvmlShutdown");
	if (init && version && shutdown && init() == 0) {
		ok = version(buf, sizeof(buf)) == 0 && buf[0];
		shutdown();
	}
	dlclose(dl);
	if (ok)
		snprintf(out, size, "%s", buf);
	return ok;
}

void cuda_driver_version(char *out, size_t size)
{
	int v = 0;

	if (nvml_version(out, size))
		return;
	if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0)
		snprintf(out, size, "%d.%d", v / 1000, v % 1000 / 10);
	else
		snprintf(out, size, "%s", "");
}
