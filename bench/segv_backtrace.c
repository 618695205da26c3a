/* LD_PRELOAD'ed into a crashing test on a machine without gdb
 * (bench/gpu.sh): on SIGSEGV, SIGBUS or SIGABRT prints the stack to stderr
 * as "object(+offset)" lines, which addr2line turns into functions and
 * lines, then dies of the signal. Installed before main, so a framework
 * that installs its own handler and re-raises on the way out (Catch2)
 * lands here with the faulting frames still on the stack. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void on_fatal(int sig, siginfo_t* info, void* uc_) {
  void* frames[64];
  const char head[] = "segv_backtrace: fatal signal, stack:\n";
  write(2, head, sizeof head - 1);
  /* The faulting instruction and, for a call through a bad pointer (where
   * the unwinder stops), the return address on top of the stack. */
  ucontext_t* uc = (ucontext_t*)uc_;
  void* pcs[2] = {(void*)uc->uc_mcontext.gregs[REG_RIP], *(void**)uc->uc_mcontext.gregs[REG_RSP]};
  backtrace_symbols_fd(pcs, 2, 2);
  (void)info;
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1); /* loads libgcc_s now, not inside the handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESETHAND;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
