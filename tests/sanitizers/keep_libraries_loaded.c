/* Preloaded by `make test-asan`: dlclose that leaves the library mapped.
 * Open MPI loads its components with dlopen and unloads them at
 * MPI_Finalize, before LeakSanitizer looks; the memory they kept then has
 * allocation stacks in no known library, which no suppression can name.
 * Kept loaded, the stacks name mca_* and libopen-pal, and lsan.supp matches
 * them, while a leak in lockstep still fails the run. */
int dlclose(void *handle) {
  (void)handle;
  return 0;
}
