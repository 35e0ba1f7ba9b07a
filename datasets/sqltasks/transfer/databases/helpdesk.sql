-- A customer-support desk of a software company: organisations and their people open tickets,
-- agents (with team leads) answer them, tickets carry tags, comments and satisfaction ratings.
CREATE TABLE Organizations (OrganizationId INTEGER PRIMARY KEY, Name VARCHAR NOT NULL, Plan VARCHAR NOT NULL, Country VARCHAR NOT NULL, CreatedAt DATE NOT NULL);
CREATE TABLE Agents (AgentId INTEGER PRIMARY KEY, FullName VARCHAR NOT NULL, Email VARCHAR NOT NULL, TeamLeadId INTEGER REFERENCES Agents(AgentId), HiredOn DATE NOT NULL, IsActive BOOLEAN NOT NULL);
CREATE TABLE Customers (CustomerId INTEGER PRIMARY KEY, OrganizationId INTEGER NOT NULL REFERENCES Organizations(OrganizationId), FullName VARCHAR NOT NULL, Email VARCHAR NOT NULL, IsVip BOOLEAN NOT NULL);
CREATE TABLE Tickets (TicketId INTEGER PRIMARY KEY, CustomerId INTEGER NOT NULL REFERENCES Customers(CustomerId), AssigneeId INTEGER REFERENCES Agents(AgentId), Subject VARCHAR NOT NULL, Priority VARCHAR NOT NULL, Status VARCHAR NOT NULL, Channel VARCHAR NOT NULL, OpenedAt DATE NOT NULL, ClosedAt DATE);
CREATE TABLE Tags (TagId INTEGER PRIMARY KEY, Label VARCHAR NOT NULL);
CREATE TABLE TicketTags (TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), TagId INTEGER NOT NULL REFERENCES Tags(TagId), PRIMARY KEY (TicketId, TagId));
CREATE TABLE Comments (CommentId INTEGER PRIMARY KEY, TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), AgentId INTEGER REFERENCES Agents(AgentId), Body VARCHAR NOT NULL, IsPublic BOOLEAN NOT NULL, PostedAt DATE NOT NULL);
CREATE TABLE SatisfactionRatings (RatingId INTEGER PRIMARY KEY, TicketId INTEGER NOT NULL REFERENCES Tickets(TicketId), Score INTEGER NOT NULL, LeftOn DATE NOT NULL);
INSERT INTO Organizations VALUES
  (1, 'Brightloop', 'enterprise', 'Germany', DATE '2021-03-14'),
  (2, 'Quillstack', 'team', 'Canada', DATE '2022-01-09'),
  (3, 'Harbor Analytics', 'free', 'Ireland', DATE '2023-06-30'),
  (4, 'Nimbus Print', 'team', 'Germany', DATE '2020-11-02'),
  (5, 'Tealeaf Health', 'enterprise', 'Australia', DATE '2022-08-21'),
  (6, 'Copperfield Legal', 'free', 'Canada', DATE '2024-02-11');
INSERT INTO Agents VALUES (1, 'Marta Lindgren', 'marta@support.example', NULL, DATE '2019-04-01', TRUE);
INSERT INTO Agents VALUES (2, 'Kofi Boateng', 'kofi@support.example', 1, DATE '2020-09-15', TRUE);
INSERT INTO Agents VALUES (3, 'Sana Qureshi', 'sana@support.example', 1, DATE '2021-02-01', TRUE);
INSERT INTO Agents VALUES (4, 'Diego Ferreira', 'diego@support.example', NULL, DATE '2019-07-22', TRUE);
INSERT INTO Agents VALUES (5, 'Ivy Chen', 'ivy@support.example', 4, DATE '2022-05-09', TRUE);
INSERT INTO Agents VALUES (6, 'Tomas Novak', 'tomas@support.example', 4, DATE '2023-01-16', FALSE);
INSERT INTO Agents VALUES (7, 'Aiko Mori', 'aiko@support.example', 4, DATE '2023-10-02', TRUE);
INSERT INTO Customers VALUES
  (1, 1, 'Helena Fischer', 'helena@brightloop.example', TRUE),
  (2, 1, 'Jonas Weber', 'jonas@brightloop.example', FALSE),
  (3, 2, 'Priya Raman', 'priya@quillstack.example', FALSE),
  (4, 2, 'Owen Clarke', 'owen@quillstack.example', TRUE),
  (5, 3, 'Niamh Byrne', 'niamh@harbor.example', FALSE),
  (6, 4, 'Lukas Braun', 'lukas@nimbus.example', FALSE),
  (7, 5, 'Grace Tan', 'grace@tealeaf.example', TRUE),
  (8, 5, 'Ravi Patel', 'ravi@tealeaf.example', FALSE),
  (9, 5, 'Emily Watson', 'emily@tealeaf.example', FALSE),
  (10, 6, 'Marc Tremblay', 'marc@copperfield.example', FALSE),
  (11, 3, 'Ada Moreau', 'ada@harbor.example', FALSE),
  (12, 4, 'Felix Wagner', 'felix@nimbus.example', TRUE);
INSERT INTO Tickets VALUES
  (101, 1, 2, 'Cannot export invoices to CSV', 'high', 'solved', 'email', DATE '2024-01-08', DATE '2024-01-10'),
  (102, 1, 3, 'SSO login loops back to start', 'urgent', 'closed', 'chat', DATE '2024-01-15', DATE '2024-01-15'),
  (103, 2, 2, 'Question about seat pricing', 'low', 'closed', 'email', DATE '2024-02-02', DATE '2024-02-05'),
  (104, 3, 5, 'Webhook retries failing', 'high', 'pending', 'web', DATE '2024-02-19', NULL),
  (105, 4, 5, 'Add a second admin', 'normal', 'solved', 'chat', DATE '2024-03-01', DATE '2024-03-02'),
  (106, 4, NULL, 'Dark mode request', 'low', 'open', 'web', DATE '2024-03-11', NULL),
  (107, 5, 3, 'Password reset email never arrives', 'high', 'solved', 'email', DATE '2024-03-20', DATE '2024-03-22'),
  (108, 6, 6, 'Printer integration times out', 'normal', 'closed', 'phone', DATE '2024-04-03', DATE '2024-04-12'),
  (109, 7, 7, 'Data residency in Australia', 'urgent', 'pending', 'phone', DATE '2024-04-18', NULL),
  (110, 7, 2, 'Audit log missing entries', 'high', 'open', 'email', DATE '2024-05-06', NULL),
  (111, 8, 7, 'Bulk import of patients fails', 'high', 'solved', 'web', DATE '2024-05-14', DATE '2024-05-20'),
  (112, 9, 3, 'Change billing contact', 'low', 'solved', 'email', DATE '2024-05-27', DATE '2024-05-28'),
  (113, 10, NULL, 'Is there a discount for charities?', 'normal', 'open', 'chat', DATE '2024-06-03', NULL),
  (114, 1, 5, 'API rate limit too low', 'normal', 'solved', 'web', DATE '2024-06-10', DATE '2024-06-14'),
  (115, 2, 2, 'Invoice shows wrong VAT number', 'high', 'closed', 'email', DATE '2024-06-21', DATE '2024-06-24'),
  (116, 8, 6, 'Two-factor codes rejected', 'urgent', 'closed', 'phone', DATE '2024-07-01', DATE '2024-07-01'),
  (117, 3, 7, 'Webhook signature mismatch', 'high', 'solved', 'web', DATE '2024-07-09', DATE '2024-07-15'),
  (118, 9, NULL, 'Export reports as PDF', 'low', 'open', 'web', DATE '2024-07-22', NULL);
INSERT INTO Tags VALUES (1, 'billing'), (2, 'authentication'), (3, 'integrations'), (4, 'feature-request'), (5, 'bug'), (6, 'compliance'), (7, 'onboarding');
INSERT INTO TicketTags VALUES
  (101, 1), (101, 5), (102, 2), (102, 5), (103, 1), (104, 3), (104, 5), (105, 2), (106, 4),
  (107, 2), (107, 5), (108, 3), (109, 6), (110, 6), (110, 5), (111, 3), (112, 1), (113, 1),
  (114, 3), (114, 4), (115, 1), (115, 5), (116, 2), (117, 3), (118, 4);
INSERT INTO Comments VALUES
  (1, 101, NULL, 'The export button does nothing.', TRUE, DATE '2024-01-08'),
  (2, 101, 2, 'Fixed in today''s release, please retry.', TRUE, DATE '2024-01-10'),
  (3, 102, 3, 'Escalated to the identity team.', FALSE, DATE '2024-01-15'),
  (4, 102, 3, 'Your IdP certificate had expired; renewed.', TRUE, DATE '2024-01-15'),
  (5, 104, 5, 'We can reproduce the failed retries.', TRUE, DATE '2024-02-20'),
  (6, 104, NULL, 'Any update on this?', TRUE, DATE '2024-03-04'),
  (7, 107, 3, 'Your mail server rejected our sender.', TRUE, DATE '2024-03-21'),
  (8, 108, 6, 'Asked the vendor for logs.', FALSE, DATE '2024-04-05'),
  (9, 109, 7, 'Legal review requested.', FALSE, DATE '2024-04-19'),
  (10, 109, 4, 'Approved to share our DPA.', FALSE, DATE '2024-04-25'),
  (11, 110, NULL, 'Entries from May 1 are missing.', TRUE, DATE '2024-05-06'),
  (12, 111, 7, 'The CSV had a BOM; import works without it.', TRUE, DATE '2024-05-19'),
  (13, 114, 5, 'Limit raised to 600 requests per minute.', TRUE, DATE '2024-06-14'),
  (14, 115, 2, 'Corrected the VAT number on the account.', TRUE, DATE '2024-06-24'),
  (15, 116, 6, 'Clock drift on the device; resynced.', TRUE, DATE '2024-07-01'),
  (16, 117, 7, 'Secret was rotated; signatures match now.', TRUE, DATE '2024-07-15'),
  (17, 117, 1, 'Adding this to the integration guide.', FALSE, DATE '2024-07-16');
INSERT INTO SatisfactionRatings VALUES
  (1, 101, 5, DATE '2024-01-11'), (2, 102, 4, DATE '2024-01-16'), (3, 103, 3, DATE '2024-02-06'),
  (4, 105, 5, DATE '2024-03-03'), (5, 107, 2, DATE '2024-03-25'), (6, 108, 1, DATE '2024-04-13'),
  (7, 111, 4, DATE '2024-05-21'), (8, 112, 5, DATE '2024-05-29'),
  (10, 115, 4, DATE '2024-06-25'), (11, 116, 5, DATE '2024-07-02'), (12, 117, 2, DATE '2024-07-16');
