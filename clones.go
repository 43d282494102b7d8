package harebox

// stepHook, set by tests only (export_test.go), is called at each step of
// a golden boot and of a pool refill with the directory it concerns: a
// crash test holds the engine there, or watches that directory, to kill
// it at that step.
var stepHook func(step, dir string)

func atStep(step, dir string) {
	if stepHook != nil {
		stepHook(step, dir)
	}
}
