/*
 * The emulated "device kernels", run when a stream is synchronised: paged attention (FIA) and
 * the paged KV scatter, written here independently of kvshare, in double precision. Device data
 * the host side of CANN cannot see at launch time (block ids, slots, the mask's contents) is
 * checked here; a bad value is a fault (counted, reported by emu_last_fault), as a device
 * exception would be.
 */
#define EMU_IN_ASCENDCL
#include <math.h>

#include "emu.h"

static int64_t load_int(const emu_view *v, const int64_t *idx) {
    const char *p = emu_at(v, idx);
    if (v->dtype == DT_INT64) {
        int64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, p, 4);
    return x;
}

/* One K or V element: as stored, or for int8 K/V scale * (code + offset) of channel g*D + d,
 * the scale and offset read in their own dtype (the query's). */
static double kv_elem(const emu_op *o, const emu_view *kv, const int64_t *idx, const emu_view *sc,
                      const emu_view *off, int64_t g, int64_t d) {
    const char *p = emu_at(kv, idx);
    if (!o->antiquant) return emu_load(p, kv->dtype);
    int64_t c = g * o->D + d, cidx[4] = {0, 0, 0, 0};
    cidx[sc->ndim - 1] = c; /* contiguous: the last axis walks every channel */
    double x = *(const int8_t *)p;
    double offset = o->has_offset ? emu_load(emu_at(off, cidx), off->dtype) : 0.0;
    return emu_load(emu_at(sc, cidx), sc->dtype) * (x + offset);
}

void emu_run_fia(const emu_op *o) {
    if (o->mask_kind == 1) {
        for (int64_t i = 0; i < 2048; i++)
            for (int64_t j = 0; j < 2048; j++) {
                int64_t idx[2] = {i, j};
                int8_t m = *(const int8_t *)emu_at(&o->mask, idx);
                if (m != (j > i ? 1 : 0)) {
                    emu_fault("FIA: attenMask[%lld][%lld] = %d is not triu(ones(2048, 2048), 1)",
                              (long long)i, (long long)j, m);
                    return;
                }
            }
    }
    int64_t group = o->N / o->KVH, D = o->D, bs = o->bs;
    double *q = malloc((size_t)D * sizeof *q), *acc = malloc((size_t)D * sizeof *acc);
    double *sc = NULL;
    int64_t sc_cap = 0;
    for (int64_t b = 0; b < o->B; b++) {
        int64_t ql = o->q_len[b], kl = o->kv_len[b], qs = o->q_start[b];
        int64_t npages = (kl + bs - 1) / bs;
        int64_t *pages = malloc((size_t)(npages ? npages : 1) * 8);
        for (int64_t p = 0; p < npages; p++) {
            int64_t idx[2] = {b, p};
            pages[p] = load_int(&o->bt, idx);
            if (pages[p] < 0 || pages[p] >= o->nb) {
                emu_fault("FIA: blockTable[%lld][%lld] = %lld is not a block in [0, %lld)",
                          (long long)b, (long long)p, (long long)pages[p], (long long)o->nb);
                free(pages);
                goto out;
            }
        }
        if (kl > sc_cap) {
            sc_cap = kl;
            sc = realloc(sc, (size_t)sc_cap * sizeof *sc);
        }
        /* Decode mask (incremental branch): a nonzero byte hides that key. */
        unsigned char *hidden = calloc((size_t)(kl ? kl : 1), 1);
        if (o->mask_kind == 2)
            for (int64_t j = 0; j < kl; j++) {
                int64_t midx[4] = {b, 0, 0, 0};
                midx[o->mask.ndim - 1] = j;
                hidden[j] = *(const unsigned char *)emu_at(&o->mask, midx) != 0;
            }
        for (int64_t i = 0; i < ql; i++) {
            /* Right-down reference: row i's diagonal is key kl - ql + i. Sparse 3 sees keys up
             * to the diagonal; sparse 4 sees diag - preTokens ..= diag + nextTokens. */
            int64_t diag = kl - ql + i, first = 0, lim = kl;
            if (o->sparse == 3) lim = diag + 1;
            if (o->sparse == 4) {
                first = diag - o->pre > 0 ? diag - o->pre : 0;
                lim = o->next < kl - diag ? diag + o->next + 1 : kl;
            }
            int64_t seen = 0;
            for (int64_t n = 0; n < o->N; n++) {
                int64_t g = n / group;
                int64_t qidx[4];
                if (o->layout == 0) { qidx[0] = b; qidx[1] = i; qidx[2] = n; qidx[3] = 0; }
                else if (o->layout == 1) { qidx[0] = b; qidx[1] = n; qidx[2] = i; qidx[3] = 0; }
                else { qidx[0] = qs + i; qidx[1] = n; qidx[2] = 0; }
                int dq = o->layout == 2 ? 2 : 3;
                for (int64_t d = 0; d < D; d++) {
                    qidx[dq] = d;
                    q[d] = emu_load(emu_at(&o->q, qidx), o->q.dtype);
                }
                double mx = -INFINITY;
                seen = 0;
                for (int64_t j = first; j < lim; j++) {
                    if (hidden[j]) continue;
                    seen++;
                    int64_t page = pages[j / bs], slot = j % bs;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) {
                        int64_t kidx[4];
                        if (o->kv4d) { kidx[0] = page; kidx[1] = g; kidx[2] = slot; kidx[3] = d; }
                        else { kidx[0] = page; kidx[1] = slot; kidx[2] = g * D + d; }
                        dot += q[d] * kv_elem(o, &o->k, kidx, &o->kas, &o->kao, g, d);
                    }
                    sc[j] = dot * o->scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0;
                for (int64_t j = first; j < lim; j++) {
                    if (hidden[j]) continue;
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (int64_t d = 0; d < D; d++) acc[d] = 0;
                for (int64_t j = first; j < lim; j++) {
                    if (hidden[j]) continue;
                    int64_t page = pages[j / bs], slot = j % bs;
                    for (int64_t d = 0; d < D; d++) {
                        int64_t vidx[4];
                        if (o->kv4d) { vidx[0] = page; vidx[1] = g; vidx[2] = slot; vidx[3] = d; }
                        else { vidx[0] = page; vidx[1] = slot; vidx[2] = g * D + d; }
                        acc[d] += sc[j] * kv_elem(o, &o->v, vidx, &o->vas, &o->vao, g, d);
                    }
                }
                for (int64_t d = 0; d < D; d++) {
                    qidx[dq] = d;
                    emu_store(emu_at(&o->out, qidx), o->out.dtype, seen > 0 ? acc[d] / sum : 0.0);
                }
            }
        }
        free(hidden);
        free(pages);
    }
out:
    free(q);
    free(acc);
    free(sc);
}

void emu_run_scatter(const emu_op *o) {
    int64_t T = o->key.dims[0], N = o->key.dims[1], D = o->key.dims[2];
    int64_t nb = o->kc.dims[0], bs = o->kc.dims[1];
    size_t esz = emu_dtype_size(o->key.dtype);
    unsigned char *seen = calloc((size_t)(nb * bs), 1);
    for (int64_t t = 0; t < T; t++) {
        int64_t idx1[1] = {t};
        int64_t slot = load_int(&o->slots, idx1);
        if (slot < 0 || slot >= nb * bs) {
            emu_fault("ScatterPaKvCache: slotMapping[%lld] = %lld is not in [0, %lld)",
                      (long long)t, (long long)slot, (long long)(nb * bs));
            continue;
        }
        if (seen[slot]++) {
            emu_fault("ScatterPaKvCache: slot %lld appears twice (slots must be unique)",
                      (long long)slot);
            continue;
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < D; d++) {
                int64_t s3[3] = {t, n, d}, c4[4] = {slot / bs, slot % bs, n, d};
                memcpy(emu_at(&o->kc, c4), emu_at(&o->key, s3), esz);
                memcpy(emu_at(&o->vc, c4), emu_at(&o->value, s3), esz);
            }
    }
    free(seen);
}
