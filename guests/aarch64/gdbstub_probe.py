#!/usr/bin/env python3
"""Asks QEMU's GDB stub about the AArch64 demo guest, with raw RSP packets, and prints
what GDBSTUB.md records: the target description and its annexes, the register numbers of
the core and system registers, the `g` reply's layout, the threads before and after the
guest starts its second vCPU (PSCI CPU_ON), the stop reply, and the values of the
translation registers per vCPU once the kernel runs.

Usage: gdbstub_probe.py IMAGE [QEMU]   (starts QEMU itself, paused with -S, on a free port;
       GLASS_CPU=... picks another -cpu than cortex-a57)
"""
import os
import re
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET


class Stub:
    def __init__(self, port):
        for _ in range(100):
            try:
                self.sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        self.buf = b""

    def _read(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def packet(self):
        """The next $...#xx packet (acked), without the framing."""
        while True:
            start = self.buf.find(b"$")
            end = self.buf.find(b"#", start)
            if start >= 0 and end >= 0 and len(self.buf) >= end + 3:
                body = self.buf[start + 1:end]
                self.buf = self.buf[end + 3:]
                self.sock.sendall(b"+")
                return unescape(body).decode("latin-1")
            self._read()

    def send(self, body, reply=True):
        data = body.encode("latin-1")
        self.sock.sendall(b"$" + data + b"#%02x" % (sum(data) & 0xFF))
        return self.packet() if reply else None

    def interrupt(self):
        self.sock.sendall(b"\x03")
        return self.packet()

    def xfer(self, obj, annex):
        out, offset = "", 0
        while True:
            r = self.send(f"qXfer:{obj}:read:{annex}:{offset:x},ffb")
            if not r or r[0] not in "ml":
                return f"(not supported: reply {r!r})"
            out += r[1:]
            offset += len(r) - 1
            if r[0] == "l":
                return out


def unescape(body):
    out, i = bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == 0x7D:  # '}' escape
            out.append(body[i + 1] ^ 0x20)
            i += 2
        elif c == 0x2A and out:  # run-length: previous char repeated
            out += bytes([out[-1]]) * (body[i + 1] - 29)
            i += 2
        else:
            out.append(c)
            i += 1
    return bytes(out)


def le64(hexstr):
    return int.from_bytes(bytes.fromhex(hexstr), "little")


def load_symbols(image):
    """(address, name) of the image's functions, with the cross nm if there is one."""
    try:
        out = subprocess.run(["aarch64-linux-gnu-nm", "-n", image], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [(int(a, 16), n) for a, k, n in (l.split() for l in out.splitlines() if len(l.split()) == 3)
            if k in "tT"]


def symbolize(symbols, addr):
    best = None
    for a, n in symbols:
        if a <= addr:
            best = (a, n)
    return f"{best[1]}+{addr - best[0]:#x}" if best else f"{addr:#x}"


def collapse(names):
    """Runs of the same function (recursion) as name xN."""
    out = []
    for n in names:
        base = n.split("+")[0]
        if out and out[-1][0] == base:
            out[-1][1] += 1
        else:
            out.append([base, 1, n])
    return [n if c == 1 else f"{b} x{c}" for b, c, n in out]


def threads(stub):
    ids, r = [], stub.send("qfThreadInfo")
    while r.startswith("m"):
        ids += r[1:].split(",")
        r = stub.send("qsThreadInfo")
    return ids


def main():
    image = sys.argv[1]
    qemu = sys.argv[2] if len(sys.argv) > 2 else "qemu-system-aarch64"
    cpu = os.environ.get("GLASS_CPU", "cortex-a57")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [qemu, "-M", "virt", "-cpu", cpu, "-smp", "2", "-m", "128", "-accel", "tcg",
         "-display", "none", "-nodefaults", "-serial", "file:/dev/null",
         "-gdb", f"tcp:127.0.0.1:{port}", "-S", "-kernel", image])
    try:
        stub = Stub(port)
        print("qSupported:", stub.send("qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;xmlRegisters=aarch64"))
        print("? (stop reply while paused by -S):", stub.send("?"))
        print("qfThreadInfo at reset:", threads(stub))
        print("qC:", stub.send("qC"))
        for t in threads(stub):
            print(f"  qThreadExtraInfo,{t}:", bytes.fromhex(stub.send(f"qThreadExtraInfo,{t}")).decode())

        # Target description: every annex, every register with its number.
        target = stub.xfer("features", "target.xml")
        print("\n--- target.xml\n" + target)
        regs, regnum = [], 0
        for inc in re.findall(r'<xi:include href="([^"]+)"', target):
            xml = stub.xfer("features", inc)
            feature = ET.fromstring(xml)
            names = []
            for reg in feature.iter("reg"):
                regnum = int(reg.get("regnum", regnum))
                regs.append((regnum, reg.get("name"), int(reg.get("bitsize")), feature.get("name"), inc))
                names.append(reg.get("name"))
                regnum += 1
            print(f"annex {inc}: feature {feature.get('name')}, {len(names)} registers, "
                  f"numbers {regs[-len(names)][0]}..{regs[-1][0]}" if names else f"annex {inc}: empty")
        byname = {r[1]: r for r in regs}
        dups = sorted({r[1] for r in regs if sum(1 for q in regs if q[1] == r[1]) > 1})
        print("names listed more than once:", dups)
        print("system-registers.xml names:", " ".join(f"{r[1]}={r[0]}" for r in regs if r[0] >= 68))
        print("\n--- register numbers")
        for name in ["x0", "x29", "x30", "sp", "pc", "cpsr", "fpsr", "fpcr", "v0", "v31",
                     "TTBR0_EL1", "TTBR1_EL1", "TCR_EL1", "SCTLR_EL1", "SCTLR", "MAIR_EL1", "VBAR_EL1", "VBAR",
                     "ESR_EL1", "FAR_EL1", "ELR_EL1", "SP_EL0", "SP_EL1", "CurrentEL", "MPIDR_EL1",
                     "CNTVCT_EL0", "CNTFRQ_EL0", "CNTV_CTL_EL0", "CNTV_CVAL_EL0", "SPSR_EL1",
                     "CONTEXTIDR_EL1", "TPIDR_EL1"]:
            r = byname.get(name)
            print(f"  {name}: " + (f"regnum {r[0]} (0x{r[0]:x}) bits {r[2]} in {r[3]} ({r[4]})" if r else "not listed"))

        g = stub.send("g")
        print(f"\n--- g reply: {len(g)} hex chars = {len(g) // 2} bytes")
        total = 0
        for r in regs:
            if total * 2 >= len(g):
                print(f"  g stops before regnum {r[0]} ({r[1]}); covered 0..{r[0] - 1}")
                break
            total += r[2] // 8

        def show(label):
            print(f"\n--- {label}")
            for t in threads(stub):
                stub.send(f"Hg{t}")
                g = stub.send("g")
                pc = le64(g[32 * 16:33 * 16])
                sp = le64(g[31 * 16:32 * 16])
                x29 = le64(g[29 * 16:30 * 16])
                x30 = le64(g[30 * 16:31 * 16])
                cpsr = le64(g[33 * 16:33 * 16 + 8].ljust(16, "0"))
                out = [f"thread {t}: pc={pc:#x} sp={sp:#x} x29={x29:#x} x30={x30:#x} cpsr={cpsr:#x}"]
                for name in ["pc", "sp", "cpsr", "SP_EL1", "TTBR0_EL1", "TTBR1_EL1", "TCR_EL1", "SCTLR", "MAIR_EL1", "VBAR", "CNTV_CTL_EL0", "v0"]:
                    r = byname.get(name)
                    if r:
                        v = stub.send(f"p{r[0]:x}")
                        out.append(f"{name}(p{r[0]:x})=" + (f"{le64(v):#x}" if re.fullmatch("[0-9a-f]+", v) else v))
                print("  " + "\n    ".join(out))

        show("registers while paused at reset (-S)")
        stub.send("vCont;c", reply=False)
        time.sleep(3)
        print("\nstop reply after ^C:", stub.interrupt())
        print("qfThreadInfo after CPU_ON:", threads(stub))
        for t in threads(stub):
            print(f"  qThreadExtraInfo,{t}:", bytes.fromhex(stub.send(f"qThreadExtraInfo,{t}")).decode())
        show("registers after 3 s of running")
        symbols = load_symbols(image)
        print("\n--- frame-record walk (x29 chain; meaningful in the frame-pointer build)")
        for t in threads(stub):
            stub.send(f"Hg{t}")
            g = stub.send("g")
            pc, fp = le64(g[32 * 16:33 * 16]), le64(g[29 * 16:30 * 16])
            chain = [pc]
            while fp and len(chain) < 200:
                rec = stub.send(f"m{fp:x},10")
                if not re.fullmatch("[0-9a-f]{32}", rec):
                    chain.append(f"unreadable record at {fp:#x}: {rec}")
                    break
                fp, ret = le64(rec[:16]), le64(rec[16:])
                chain.append(ret)
            names = [symbolize(symbols, a) if isinstance(a, int) else a for a in chain]
            print(f"  thread {t}: " + " <- ".join(collapse(names)))
        # memory: virtual through the selected vCPU's MMU, or physical (QEMU extension)
        stub.send("Hg" + threads(stub)[0])
        ttbr1 = le64(stub.send(f"p{byname['TTBR1_EL1'][0]:x}"))
        print(f"\nm at TTBR1_EL1 {ttbr1:#x} (a physical address, read as virtual through TTBR0's identity map):", stub.send(f"m{ttbr1:x},10"))
        print("m ffffff8000000000+TTBR1 (the same RAM, high-half VA):", stub.send(f"m{0xffffff8000000000 + ttbr1:x},10"))
        print("qqemu.PhyMemMode:", stub.send("qqemu.PhyMemMode"), " Qqemu.PhyMemMode:1:", stub.send("Qqemu.PhyMemMode:1"))
        print("m (physical mode) at TTBR1:", stub.send(f"m{ttbr1:x},10"))
        print("m (physical mode) at a high-half VA:", stub.send(f"m{0xffffff8000000000 + ttbr1:x},10"))
        stub.send("Qqemu.PhyMemMode:0")
        print("qAttached:", stub.send("qAttached"), " qOffsets:", stub.send("qOffsets"))
        print("vCont?:", stub.send("vCont?"))
        print("qXfer:threads:", stub.xfer("threads", ""))
        stub.send("D")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
