/* Forced into every file of termchat's ggml build (-include). GCC before 13
   declares, in <amxtileintrin.h>, that `ldtilecfg` reads 8 bytes of its 64-byte
   tile configuration and that tile loads read no memory at all, so at -O3 the
   compiler drops the stores that fill the configuration (and may move stores
   past a tile load): `ldtilecfg` then faults on garbage. That is the segfault
   of ggml's AMX kernels on several rows (prefill, draft verification) in
   -O3 builds with GCC 12. These definitions take the place of that header
   (its include guard is set first) and say what the instructions touch. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13 && defined(__x86_64__) && !defined(_AMXTILEINTRIN_H_INCLUDED)
#define _AMXTILEINTRIN_H_INCLUDED
typedef struct { unsigned char __bytes[64]; } __termchat_tile_config;
static __inline__ __attribute__((__always_inline__)) void _tile_loadconfig(const void *__config) {
  __asm__ volatile("ldtilecfg\t%X0" ::"m"(*(const __termchat_tile_config *)__config));
}
static __inline__ __attribute__((__always_inline__)) void _tile_storeconfig(void *__config) {
  __asm__ volatile("sttilecfg\t%X0" : "=m"(*(__termchat_tile_config *)__config));
}
static __inline__ __attribute__((__always_inline__)) void _tile_release(void) {
  __asm__ volatile("tilerelease" ::);
}
#define _tile_loadd(dst, base, stride) __termchat_tile_loadd(dst, base, stride)  /* two levels: TMM0 expands first */
#define __termchat_tile_loadd(dst, base, stride) \
  __asm__ volatile("tileloadd\t(%0,%1,1), %%tmm" #dst ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define _tile_stream_loadd(dst, base, stride) __termchat_tile_stream_loadd(dst, base, stride)
#define __termchat_tile_stream_loadd(dst, base, stride) \
  __asm__ volatile("tileloaddt1\t(%0,%1,1), %%tmm" #dst ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define _tile_stored(src, base, stride) __termchat_tile_stored(src, base, stride)
#define __termchat_tile_stored(src, base, stride) \
  __asm__ volatile("tilestored\t%%tmm" #src ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")
#define _tile_zero(dst) __termchat_tile_zero(dst)
#define __termchat_tile_zero(dst) __asm__ volatile("tilezero\t%%tmm" #dst ::)
#endif
