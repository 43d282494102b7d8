package audit

import (
	"context"
	"time"
)

// RecordRefusedAnswer records that the credentials proxy refused to pass
// an answer from host back to a sandbox, since it could not scrub it of
// secret values (why: an unknown content-coding, another upgrade, a
// WebSocket frame it cannot read). The upstream's act, seen on the
// sandbox's connection, and refused. The error kind is "unscrubbable";
// why goes to the engine's log.
func (l *Log) RecordRefusedAnswer(accountID, sandboxID, host string) {
	if l == nil {
		return
	}
	e := &Entry{Time: time.Now().UTC(), AccountID: accountID, Principal: "sandbox:" + sandboxID, Action: "refuseAnswer",
		Target: host, Outcome: Denied, Error: "unscrubbable"}
	if err := l.append(context.Background(), e); err != nil {
		l.log.Error("audit: cannot append", "action", e.Action, "err", err)
	}
}
