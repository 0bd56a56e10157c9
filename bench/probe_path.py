# Run inside gdb (bench/trace_guest_bench.py): stops at `marker`, returns to main, then
# single-steps the next call out of main to its return, and prints the instructions it
# took (the call and the ret included), CALLS times; then lets the program end.
import gdb

CALLS = 5
gdb.execute("break marker", to_string=True)
counts = []
for _ in range(CALLS):
    gdb.execute("continue", to_string=True)
    gdb.execute("finish", to_string=True)
    block = gdb.block_for_pc(int(gdb.parse_and_eval("$pc")))
    while block.function is None:
        block = block.superblock
    low, high = block.start, block.end
    steps, left = 0, False
    while True:
        gdb.execute("stepi", to_string=True)
        pc = int(gdb.parse_and_eval("$pc"))
        inside = low <= pc < high
        if not inside:
            left = True
        if left:
            steps += 1
        if left and inside:
            break
    counts.append(steps)
gdb.execute("delete", to_string=True)
gdb.execute("set var go_on = 0", to_string=True)
print("instructions " + " ".join(str(c) for c in counts))
