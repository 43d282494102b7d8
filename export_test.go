package harebox

// SetStepHook sets the hook called at each step of a golden boot and of a
// pool refill (stepHook), for the crash tests' child engine.
func SetStepHook(f func(step, dir string)) { stepHook = f }
