/*
 * The version macros of the header agree with the library it is linked against:
 * KVS_ABI_VERSION == kvs_abi_version(), KVS_VERSION equals kvs_version(), and the composite
 * KVS_VERSION string equals KVS_VERSION_MAJOR.MINOR.PATCH.
 */
#include "kvs_test.h"

int main(void) {
    CHECK_EQ(KVS_ABI_VERSION, kvs_abi_version());

    const char *v = kvs_version();
    CHECK(v != NULL);
    if (strcmp(v, KVS_VERSION) != 0) {
        T_FAIL("kvs_version() = \"%s\", header KVS_VERSION = \"%s\"", v, KVS_VERSION);
    }
    /* A second call returns the same static string. */
    CHECK(kvs_version() == v);

    char composed[64];
    snprintf(composed, sizeof composed, "%d.%d.%d", KVS_VERSION_MAJOR, KVS_VERSION_MINOR,
             KVS_VERSION_PATCH);
    if (strcmp(composed, KVS_VERSION) != 0) {
        T_FAIL("KVS_VERSION_MAJOR.MINOR.PATCH = \"%s\" but KVS_VERSION = \"%s\"", composed,
               KVS_VERSION);
    }
    printf("version: %s, ABI %u: ok\n", v, kvs_abi_version());
    return 0;
}
