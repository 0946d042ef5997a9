import { describe, expect, it } from "vitest";
import { sessionDurability } from "./server-durability.js";

describe("sessionDurability: the server's settings, as Keel's sessions start", () => {
  it("turns a server's synchronous_commit off into on and says so once", () => {
    const { sessionSettings, notices } = sessionDurability({ fsync: "on", synchronousCommit: "off" });
    expect(sessionSettings).toEqual({ synchronous_commit: "on" });
    expect(notices.map((notice) => notice.level)).toEqual(["info"]);
    expect(notices[0]?.message).toContain("synchronous_commit is off");
  });

  it.each(["local", "remote_write", "on", "remote_apply"])("keeps %s (each waits for the local flush) and pins it, saying nothing", (value) => {
    expect(sessionDurability({ fsync: "on", synchronousCommit: value })).toEqual({ sessionSettings: { synchronous_commit: value }, notices: [] });
  });

  it("warns of fsync off, which no session setting can mend", () => {
    const { notices } = sessionDurability({ fsync: "off", synchronousCommit: "on" });
    expect(notices.map((notice) => notice.level)).toEqual(["warn"]);
    expect(notices[0]?.message).toContain("fsync off");
  });
});
