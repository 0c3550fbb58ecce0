#ifndef PORTICO_CZLIB_SHIM_H
#define PORTICO_CZLIB_SHIM_H
#include <zlib.h>

/* deflateInit2/inflateInit2 are macros: Swift cannot call them directly. */
static inline int portico_deflateInit2(z_streamp strm, int level, int method,
                                       int windowBits, int memLevel, int strategy) {
    return deflateInit2(strm, level, method, windowBits, memLevel, strategy);
}
static inline int portico_inflateInit2(z_streamp strm, int windowBits) {
    return inflateInit2(strm, windowBits);
}
#endif
