// Slices the Subscribe fan-out across event-loop turns. One emission reaches about a hundred
// streams, and each delivery runs through the RPC stack (convert, encode, HTTP/2 write) in
// microtasks: unsliced, a commit's reply from PostgreSQL waited behind the whole fan-out. With at
// most `perTurn` deliveries per turn, the I/O phase runs between slices and waits for one at most.

export interface DeliveryPacer {
  /** Undefined when the caller may deliver one message now; else a promise for its turn. */
  take(): Promise<void> | undefined;
}

export function createDeliveryPacer(perTurn: number): DeliveryPacer {
  let used = 0;
  let armed = false;
  // A FIFO as an array and a head index: shift() on thousands of waiters would copy them each time.
  let waiting: (() => void)[] = [];
  let head = 0;

  const arm = (): void => {
    if (armed || (used === 0 && head === waiting.length)) return;
    armed = true;
    setImmediate(turn);
  };
  function turn(): void {
    armed = false;
    used = 0;
    while (used < perTurn && head < waiting.length) {
      used++;
      (waiting[head++] as () => void)();
    }
    if (head === waiting.length) {
      waiting = [];
      head = 0;
    } else if (head > 1_024) {
      waiting = waiting.slice(head);
      head = 0;
    }
    arm();
  }

  return {
    take() {
      if (used < perTurn && head === waiting.length) {
        used++;
        arm();
        return undefined;
      }
      return new Promise<void>((resolve) => {
        waiting.push(resolve);
        arm();
      });
    },
  };
}
