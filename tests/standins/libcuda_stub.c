/* A stand-in for the driver's libcuda.so.1 on machines without a GPU, used only by tests.
 * It models what the real library was seen to do on an H200 (tests/fixtures/snapshots): cuInit opens the control
 * node and the uvm node; an unusable control node gives 100 (CUDA_ERROR_NO_DEVICE), an unusable uvm node gives
 * 999 (CUDA_ERROR_UNKNOWN). The opens are real, so a device cgroup's EPERM reaches it as it reaches libcuda. */
#include <fcntl.h>
#include <unistd.h>

static int count = -1;

static int usable(const char *path) {
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

int cuInit(unsigned int flags) {
    (void)flags;
    if (!usable("/dev/nvidiactl")) return 100;
    if (!usable("/dev/nvidia-uvm")) return 999;
    count = usable("/dev/nvidia0") ? 1 : 0;
    return 0;
}

int cuDeviceGetCount(int *n) { *n = count; return count < 0 ? 3 : 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }

int cuGetErrorName(int code, const char **name) {
    switch (code) {
    case 0: *name = "CUDA_SUCCESS"; break;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return 0;
}
