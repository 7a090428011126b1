/* An LD_PRELOAD shim whose fork() fails as a full process table does
   (EAGAIN), for the tests of headgrad's exit code 4. With
   HEADGRAD_TEST_FORKS_ALLOWED=N, the first N forks of the process succeed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

pid_t fork(void) {
  static long allowed = -1;
  if (allowed < 0) {
    const char* env = getenv("HEADGRAD_TEST_FORKS_ALLOWED");
    allowed = env ? atol(env) : 0;
  }
  if (allowed > 0) {
    --allowed;
    pid_t (*real)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "fork");
    return real();
  }
  errno = EAGAIN;
  return -1;
}
