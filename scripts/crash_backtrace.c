// A crash's C and C++ stack where no debugger is installed: loaded into a
// program with LD_PRELOAD, it writes the stack of the thread that received
// SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT to stderr, one frame a line as
// glibc's backtrace_symbols_fd gives it ("object(symbol+offset) [address]",
// or "object(+offset)" for what the object does not export, which
// `addr2line -f -C -e object offset` names), then dies of the same signal.
// scripts/gpu-check.sh pyprobe builds it with the machine's C compiler.
// Python's faulthandler, if on, prints the Python stacks first and then
// hands the signal on to this handler.
//
//   cc -shared -fPIC -O1 -o crash_backtrace.so scripts/crash_backtrace.c
//   LD_PRELOAD=$PWD/crash_backtrace.so python3 -X faulthandler program.py
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static void write_text(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

static void on_crash(int signal_number) {
  write_text("crash_backtrace: ");
  write_text(strsignal(signal_number));
  write_text("; the stack of the thread that received it:\n");
  void* frames[128];
  const int count = backtrace(frames, 128);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  write_text("crash_backtrace: end of stack\n");
  signal(signal_number, SIG_DFL);  // (SA_RESETHAND did this already; the default action ends the process)
  raise(signal_number);
}

__attribute__((constructor)) static void install_crash_handler(void) {
  // backtrace() loads libgcc_s on its first call, which must not happen
  // inside the handler (it allocates): call it once here.
  void* warm_up[2];
  backtrace(warm_up, 2);
  // A stack of its own for the main thread, so that a stack overflow is
  // reported too.
  static char alternate_stack[256 * 1024];
  stack_t stack = {.ss_sp = alternate_stack, .ss_size = sizeof alternate_stack, .ss_flags = 0};
  sigaltstack(&stack, NULL);
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_crash;
  action.sa_flags = SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) sigaction(kSignals[i], &action, NULL);
}
