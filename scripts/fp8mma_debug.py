"""Tile 0 of `mla_gluon_fp8mma`'s e4m3 build taken apart on a GPU: the operands and products the kernel saw (its DEBUG
record) against the same quantities built with torch. `PYTHONPATH=src python scripts/fp8mma_debug.py [H]`"""

from __future__ import annotations

import sys

import torch

from glm5lib.kernels import mla_gluon_fp8mma as fm, naive

SM = 1.0 / 16.0


def k_perm() -> torch.Tensor:
    """p[k]: the memory column of product column k (`_k_logical`), over 512."""
    return torch.arange(512).reshape(4, 2, 2, 2, 2, 2, 4).permute(0, 3, 4, 5, 1, 2, 6).reshape(512)


def d_of_m() -> torch.Tensor:
    """d[m]: the memory column of V^T row m inside a chunk (`_v_logical`)."""
    return torch.arange(128).reshape(2, 2, 2, 2, 2, 2, 2).permute(4, 5, 0, 6, 1, 2, 3).reshape(128)


def e4m3_terms(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    out, r = [], x
    for _ in range(n):
        t = r.to(torch.float8_e4m3fn)
        out.append(t)
        r = r - t.float()
    return out


def main() -> int:
    H = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    T, N = 2, 4096
    q = torch.randn(T, H, naive.D_QK, generator=gen).to(torch.bfloat16).to(dev)
    kv = torch.randn(N, naive.D_QK, generator=gen)
    cache = naive.quantize_fp8_ds_mla(kv).to(dev)
    idx = torch.stack([torch.randperm(N, generator=gen)[:64] for _ in range(T)]).to(torch.int32).to(dev)
    HN = 8 * fm.head_groups(H)
    dbg = torch.zeros(T * fm.debug_record_bytes(H), dtype=torch.uint8, device=dev)
    # the record is the e4m3 build's (two q terms, two P terms); the fp16 build sm_90 ships has none
    o, lse = fm.sparse_mla_fp8mma(q, cache, idx, SM, num_splits=1, nbuf=2, q_terms=2, p_terms=2, block_n=fm.BLOCK_N,
                                  debug=dbg)
    torch.cuda.synchronize()
    ro, rlse = naive.sparse_mla_ref(q, cache, idx, SM, kv_format="fp8_ds_mla")
    print("out rel", float((o.float() - ro).norm() / ro.norm()), "lse max abs", float((lse - rlse).abs().max()))
    rec = dbg.view(T, -1)
    nf = 8 * 32 * HN * 4
    pk, dm = k_perm().to(dev), d_of_m().to(dev)
    for t in range(T):
        f32 = rec[t, :nf].view(torch.float32).view(8, 32, HN)
        kb = rec[t, nf:nf + 32 * 512].view(32, 512)
        vb = rec[t, nf + 32 * 512:nf + 32 * 512 + 4 * 128 * 32].view(4, 128, 32)
        qb = rec[t, nf + 32 * 512 + 4 * 128 * 32:].view(6, HN, 512)[:3]
        qr = rec[t, nf + 32 * 512 + 4 * 128 * 32:].view(6, HN, 512)[3:]
        rows = cache[idx[t, :32].long()]  # [32, 656]
        raw = rows[:, :512]
        k_exp = raw[:, pk]
        print(f"t{t} K logical equal:", bool(torch.equal(kb, k_exp)), "mismatches", int((kb != k_exp).sum()))
        v_exp = torch.stack([raw[:, c * 128 + dm].T for c in range(4)])
        print(f"t{t} V^T logical equal:", bool(torch.equal(vb, v_exp)), "mismatches", int((vb != v_exp).sum()))
        qn = q[t, :, :512].float()
        qn = torch.cat([qn, torch.zeros(HN - H, 512, device=dev)]) if HN > H else qn
        amax = qn.abs().amax(1)
        sig = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(448.0 / amax.clamp_min(1e-30)))), 1.0)
        terms = e4m3_terms(qn * sig[:, None], 3)
        inv = torch.argsort(pk)
        for j in range(3):
            q_exp = terms[j].view(torch.uint8)[:, pk]
            print(f"t{t} q term {j} equal:", bool(torch.equal(qb[j], q_exp)), "mismatches", int((qb[j] != q_exp).sum()),
                  "registers (memory order) equal:", bool(torch.equal(qr[j], terms[j].view(torch.uint8))),
                  int((qr[j] != terms[j].view(torch.uint8)).sum()))
            if t == 0 and j == 1:
                got = qb[j].view(torch.float8_e4m3fn).float()[:, inv]  # back in memory order
                x = qn * sig[:, None]
                bad = (got != terms[j].float()).nonzero()[:8]
                for h, d in bad.tolist():
                    print("   h", h, "d", d, "x", float(x[h, d]), "t0", float(terms[0][h, d].float()), "t1 kernel",
                          float(got[h, d]), "t1 torch", float(terms[j][h, d].float()))
        kq = [qb[j].view(torch.float8_e4m3fn).float()[:, inv] for j in range(fm.DEFAULT[1])]
        kf = raw.view(torch.float8_e4m3fn).float()  # [32, 512]
        qs = sum(tt.float() for tt in terms[:fm.DEFAULT[1]])
        for c in range(4):
            s_exp = kf[:, c * 128:(c + 1) * 128] @ qs[:, c * 128:(c + 1) * 128].T
            err = float((f32[c] - s_exp).abs().max() / s_exp.abs().max())
            s_k = kf[:, c * 128:(c + 1) * 128] @ sum(kq)[:, c * 128:(c + 1) * 128].T
            print(f"   against the kernel's own q terms: rel max err",
                  float((f32[c] - s_k).abs().max() / s_k.abs().max()))
            print(f"t{t} S chunk {c}: rel max err {err:.3g}", f32[c][0, :4].tolist(), s_exp[0, :4].tolist())
        scales = rows[:, 512:528].view(torch.float32)  # [32, 4]
        print(f"t{t} scale chunk 0:", bool(torch.allclose(f32[4][:, 0], scales[:, 0])), f32[4][:3, 0].tolist(),
              scales[:3, 0].tolist())
        deq = naive.dequantize_fp8_ds_mla(rows)  # [32, 576] fp32
        logit = (q[t].float() @ deq.T).T * SM * 1.4426950408889634  # [32 keys, H]
        print(f"t{t} logits: rel max err", float((f32[5][:, :H] - logit).abs().max() / logit.abs().max()),
              f32[5][0, :3].tolist(), logit[0, :3].tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
