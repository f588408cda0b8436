// The C example (examples/c/hello.c), compiled as C++: the header is C++-compatible.
#include "../c/hello.c"
