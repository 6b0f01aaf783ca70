import sys, torch, statistics
sys.path.insert(0, ".")
import fa4_aot
shapes = [(2,16,8192,128),(4,16,4096,128),(8,16,2048,128),(32,16,1024,128),(2,32,8192,64),(8,16,2048,64),(2,8,8192,256),(4,16,2048,96),(2,16,4096,192)]
for (b,h,s,d) in shapes:
    sets = [tuple(torch.randn(b,s,h,d,device="cuda",dtype=torch.bfloat16) for _ in range(3)) for _ in range(4)]
    flops = 4*b*h*s*s*d
    times = {"single": [], "steal": [], "static": []}
    for sch in times:
        for q,k,v in sets: fa4_aot.attention(q,k,v,causal=False,scheduler=sch)
    torch.cuda.synchronize()
    for r in range(10):
        order = list(times) if r % 2 == 0 else list(times)[::-1]
        for sch in order:
            st, en = torch.cuda.Event(True), torch.cuda.Event(True)
            st.record()
            for i in range(20):
                q,k,v = sets[i % 4]
                fa4_aot.attention(q,k,v,causal=False,scheduler=sch)
            en.record(); torch.cuda.synchronize()
            times[sch].append(st.elapsed_time(en)/20)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{b}x{h}x{s}x{d} noncausal  " + "  ".join(f"{k} {flops/med[k]/1e9:.0f}" for k in med) + f"  steal/single {med['single']/med['steal']:.3f}")
