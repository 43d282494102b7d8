package processes

// Noted is how many processes' command lines s keeps, over all sandboxes.
func Noted(s *Service) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.notes {
		n += len(m)
	}
	return n
}
