
import time, torch
x = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
end = time.time() + 40
while time.time() < end:
    y = x
    for _ in range(40):
        y = (y @ x).clamp_(-1, 1)
    loss = y.sum()
    print("loss", loss.item(), flush=True)
